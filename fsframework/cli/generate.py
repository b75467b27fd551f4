"""`fsf generate`: stream a continuation of a prompt from a run, a checkpoint or an export."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from fsframework.checkpoints import Checkpoint, CheckpointError, load_model
from fsframework.cli.common import EXIT_RUN_FAILED, checkpoint_dir, fail, input_file, runtime
from fsframework.data.tokenizers import load_tokenizer


def generate(checkpoint: Path = typer.Argument(..., help="run directory, checkpoint directory or export"),
             prompt: Optional[str] = typer.Option(None, help="prompt text"),
             prompt_file: Optional[Path] = typer.Option(None, help="file holding the prompt text (UTF-8)"),
             max_new_tokens: int = typer.Option(128, help="tokens to generate at most (fewer at EOS)"),
             temperature: Optional[float] = typer.Option(None, help="sampling temperature (0 = greedy; "
                                                         "default 1 unless --greedy)"),
             top_p: float = typer.Option(1.0, help="nucleus: sample from the most likely tokens holding this mass"),
             greedy: bool = typer.Option(False, "--greedy", help="always take the most likely token"),
             seed: int = typer.Option(0, help="seed of the sampler"),
             overrides: Optional[List[str]] = typer.Argument(None, help="config overrides, e.g. "
                                                             "model.attention.impl=reference")) -> None:
    """Generate text: the prompt is prefilled once with the decode cache, then the tokens are
    printed as they come, followed by tokens/s and the cache's size (docs/decoding.md).

    Example: fsf generate runs/quickstart --prompt "def fibonacci(n):" --max-new-tokens 64 --greedy
    """
    from rich.console import Console

    checkpoint_dir(checkpoint)
    if (prompt is None) == (prompt_file is None):
        fail("give the prompt with exactly one of --prompt TEXT or --prompt-file FILE")
    if greedy and temperature not in (None, 0.0):
        fail(f"--greedy and --temperature {temperature} contradict each other: choose one")
    if prompt_file is not None:
        input_file(prompt_file, "--prompt-file")
        try:
            prompt = prompt_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            fail(f"cannot read --prompt-file {prompt_file}: {exc}")
    temperature = 0.0 if greedy else (1.0 if temperature is None else temperature)
    try:
        import torch

        generate = runtime().generate
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        ckpt = Checkpoint.open(checkpoint)
        cfg = ckpt.config(overrides or [])
        tokenizer = load_tokenizer(cfg.data.tokenizer)
        ids = tokenizer.encode(prompt)
        generate.check_request(cfg, len(ids), max_new_tokens, temperature, top_p)
        model, cfg = load_model(ckpt, device, overrides or [])
    except (CheckpointError, ValueError) as exc:  # ConfigError is a ValueError
        fail(str(exc))
    console, stats, new = Console(highlight=False, soft_wrap=True), generate.GenerationStats(), []
    shown = ""
    try:
        for token in generate.stream_tokens(model, ids, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                   seed=seed, eos_id=tokenizer.eos_id, stats=stats):
            new.append(token)
            text = tokenizer.decode(new)
            if not text.endswith("\ufffd"):  # a multi-byte character is printed once it is whole
                console.print(text[len(shown):], end="", markup=False)
                shown = text
    except RuntimeError as exc:  # out of memory, a kernel failure: the run failed, the input was fine
        fail(f"generation failed: {exc}", EXIT_RUN_FAILED)
    console.print(tokenizer.decode(new)[len(shown):], markup=False)
    console.print(f"[dim]{stats.new_tokens} tokens, {stats.tokens_per_s:.1f} tokens/s "
                  f"(prefill of {stats.prompt_tokens} tokens: {stats.prefill_s:.2f} s); "
                  f"cache {stats.cache_bytes / 2**20:.2f} MiB[/]")
