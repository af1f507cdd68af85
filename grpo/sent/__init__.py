"""SENT: semantic-entropy scoring of the training questions and the curriculum built from it.

- ``entropy``: cluster sampled answers by verified equivalence, semantic entropy, one question's record;
- ``scoring``: the resumable scoring run over all questions with a generation engine;
- ``outputs``: what the sent stage writes (scores, curriculum, histogram, metrics);
- ``curriculum``: easy-to-hard order, stages and the training-time schedule.
"""
