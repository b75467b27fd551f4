"""The training loop: config -> model -> DeepSpeed engine -> steps -> checkpoints.

Loop state lives in `TrainState` (checkpointed with the engine, with the batch source's
position); one optimizer step is `train_step`, which asks the batch source
(`fsframework.data.sources`) for `grad_accum` micro-batches and runs `forward_backward` on each:
this rank's part of the batch (`fsframework.parallel.batch.shard_batch`), the model's per-token
losses (its output head run `train.loss_chunk` positions at a time) and the one loss reduction
(`fsframework.models.losses`).
"""

from __future__ import annotations

import functools
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from rich.markup import escape
from torch import nn

import fsframework.quiet as quiet
from fsframework.checkpoints import (CheckpointError, RunDir, find_latest, init_from, read_config, training_step,
                                     writing)
from fsframework.config import Config, check_world_size, global_batch_sequences, to_yaml
from fsframework.data.loader import check_data_fits, check_shard_files, derived_data_location, unlink_shared_memory
from fsframework.data.source_table import SourceContext, build_source, source_streams
from fsframework.models.compile import compile_blocks
from fsframework.models.registry import build_model, check_trainable, count_parameters
from fsframework.models.documents import document_lengths
from fsframework.models.flops import packed_flops_per_token, training_flops_per_token
from fsframework.parallel.deepspeed_config import deepspeed_config, use_bf16
from fsframework.parallel.deepspeed_start import import_muon_lazily, skip_shared_memory_allreduce
from fsframework.parallel.groups import init_groups
from fsframework.parallel.batch import shard_batch
from fsframework.parallel.collective_time import SP_COLLECTIVES, CollectiveClock, CollectiveLap
from fsframework.parallel.health import init_health_group, reraise_naming_rank
from fsframework.parallel.parallelize import parallelize, sp_context
from fsframework.parallel.process_group import DistInfo, barrier, init_distributed
from fsframework.train import resume, resume_config
from fsframework.train.hparams import run_hparams
from fsframework.train.monitor import Monitor, console
from fsframework.train.nonfinite import SkippableAdamW, apply_nonfinite_policy
from fsframework.train.preemption import (EXIT_INTERRUPTED, EXIT_PREEMPTED, INTERRUPT, NONE, PREEMPT, RunStopped,
                                          StopRequests)
from fsframework.train.resume_config import apply_optimizer_settings
from fsframework.train.profiling import StepProfiler
from fsframework.train.memory_estimate import check_memory
from fsframework.train.restarts import killed_here, restart_of_this_run
from fsframework.train.schedule import lr_factor
from fsframework.train.stragglers import StragglerWatch, gather_busy_seconds
from fsframework.train.throughput import (StepClock, device_peak_tflops, peak_memory_mb, step_record,
                                          time_gradient_reduction)
from fsframework.train.validation import validation_sets


@dataclass
class TrainState:
    step: int = 0  # optimizer steps taken
    tokens: int = 0  # training tokens consumed (all ranks)
    best_val_ppl: float = float("inf")  # validation perplexity (train.eval_every), best so far
    evals_since_best: int = 0  # evaluations in a row without a new best (early stopping)
    skipped_steps: int = 0  # steps whose update a non-finite loss skipped (train.nonfinite=skip)
    nonfinite_in_row: int = 0  # of them, the latest ones in a row



# FreeSolo's long-range readout gains, g or log g (docs/freesolo.md §1.6): the group with its own lr
READOUT_GAIN_NAMES = ("lr_norm_weight", "lr_norm_log_gain")


def param_groups(model: nn.Module, weight_decay: float, lr: float,
                 readout_gain_lr: float = 1.0) -> list[dict[str, Any]]:
    """Decay matrices only; norms and biases are left alone. FreeSolo's readout gains (`[H, d]`)
    form a third group at `readout_gain_lr * lr`, without decay, when that multiplier is not 1;
    at 1 they stay in the decayed group, as every run before the multiplier trained them, so
    such a run keeps its two groups (and its optimizer state resumes)."""
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    gains = [p for name, p in named if name.endswith(READOUT_GAIN_NAMES)] if readout_gain_lr != 1.0 else []
    taken = {id(p) for p in gains}
    decay = [p for _, p in named if p.dim() >= 2 and id(p) not in taken]
    rest = [p for _, p in named if p.dim() < 2 and id(p) not in taken]
    groups = [{"params": decay, "weight_decay": weight_decay, "lr": lr},
              {"params": rest, "weight_decay": 0.0, "lr": lr}]
    if gains:
        groups.append({"params": gains, "weight_decay": 0.0, "lr": lr * readout_gain_lr})
    return groups


class Trainer:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.run = RunDir(Path(cfg.run_dir))
        self.run_dir = self.run.root
        self.ckpt_root = self.run.checkpoints
        self.dist: DistInfo = init_distributed(cfg.parallel.backend, cfg.parallel.timeout_s)
        check_world_size(self.dist.world_size, cfg.parallel.sp)  # the ranks must tile into SP groups
        self.groups = init_groups(cfg.parallel.sp, cfg.parallel.timeout_s)
        init_health_group(cfg.parallel.timeout_s)
        self.state = TrainState()
        self.resume_from: Optional[Path] = None  # the checkpoint found to resume from (check_resume)
        self.resumed_config: Optional[Config] = None  # the config it was written with
        self.resume_changes: list[str] = []  # optimizer and schedule keys this run changes (applied)
        self._resume_checked = False
        self.resumed_from: Optional[Path] = None  # the checkpoint this run resumed from
        self.restart = restart_of_this_run()  # (number, reason) when `fsf launch` restarted the job
        self.last_checkpoint: Optional[Path] = None  # the newest checkpoint a rerun would resume from
        self.tokenizer = None  # the main rank's (name, contents) of a file tokenizer, set in build()
        self.source = None  # the batch source, made in build() (fsframework.data.source_table)
        self.num_parameters: Optional[int] = None  # the model's, counted in build()
        self.log = console.print if self.dist.is_main else (lambda *a, **k: None)
        self.clock = StepClock()  # each step's time by phase: data wait, forward and backward, optimizer
        self.grad_reduce: Optional[CollectiveClock] = None  # the engine's gradient reduction, where timed
        self.collective_laps: dict[str, CollectiveLap] = {}  # the last step's collectives, read when logged

    def build(self) -> None:
        import deepspeed

        cfg = self.cfg
        quiet.set_log_level(cfg.train.log_level)  # after DeepSpeed's import, which sets its logger's level
        if self.dist.is_main:
            self.tokenizer = writing.read_tokenizer(cfg.data.tokenizer)  # written into every checkpoint
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.run.config.write_text(to_yaml(cfg))
            source_streams(cfg, build=True)  # builds the built-in corpus once, before other ranks read it
            located = derived_data_location(cfg)  # a directory derived from the config: say which
            if located:
                self.log(escape(located))
        barrier()
        streams = source_streams(cfg, build=False)  # none for generated rows
        check_shard_files([location for location, _ in streams])

        torch.manual_seed(cfg.train.seed)
        model = build_model(cfg.model)
        if cfg.train.init_from:
            init_from(model, cfg.train.init_from)  # a CheckpointError names every tensor that does not fit
            self.log(f"initialised weights from {cfg.train.init_from} (fresh optimizer and schedule)")
        model = parallelize(model, cfg.parallel, self.groups)  # SP when parallel.sp > 1
        shape = model.shape_summary()
        self.num_parameters = count_parameters(model)  # here: ZeRO-3 partitions the weights once the engine holds them
        self.log(f"model [bold]{cfg.model.name}[/]: {self.num_parameters / 1e6:.2f}M parameters{shape}")
        if cfg.train.activation_checkpointing:
            model.enable_activation_checkpointing()
        if cfg.train.compile:
            compile_blocks(model)
            self.log("decoder blocks compiled (train.compile): the first step compiles them")
        # only FreeSolo models have readout gains; every other kind gets the two usual groups
        groups = param_groups(model, cfg.optim.weight_decay, cfg.optim.lr, cfg.model.attention.readout_gain_lr)
        optimizer = SkippableAdamW(groups, lr=cfg.optim.lr,
                                      betas=tuple(cfg.optim.betas), eps=cfg.optim.eps)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: lr_factor(step, cfg.train.max_steps, cfg.optim))
        # the engine holds the model itself: its checkpoints name the tensors as the model does
        import_muon_lazily()  # ZeRO's Muon check otherwise loads torch's inductor: 4.4 s per rank
        skip_shared_memory_allreduce()  # a CPU backend would otherwise JIT-build it: ~90 s once per environment
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=deepspeed_config(cfg, model))
        self.optimizer_base = optimizer  # the optimizer that every ZeRO stage steps (skip_next)
        self.grad_reduce = time_gradient_reduction(self.engine, cfg.parallel.zero_stage, self.dist.world_size)
        self.model = model
        self.sp = sp_context(model)  # None unless sequence parallel
        # the source the config names, wrapped as the table says (other batches: register a source)
        self.source = build_source(cfg, SourceContext(streams=streams, dp_rank=self.groups.dp_rank,
                                                      rank=self.dist.rank, data_cache=self.run.data_cache))

    def check_resume(self) -> None:
        """Before build(): find the checkpoint to resume from and refuse, in one line, a config
        that changes what it holds (`resume_config`), so the run directory stays as it was."""
        self._resume_checked = True
        self.resume_from = find_latest(self.ckpt_root, log=lambda message: self.log(escape(message)))
        if self.resume_from is None:
            return
        resumed_step = training_step(self.resume_from)
        if self.cfg.train.max_steps < resumed_step:  # refused before config.yaml is rewritten
            raise CheckpointError(f"cannot resume {self.run_dir} at step {resumed_step} with train.max_steps="
                                  f"{self.cfg.train.max_steps}: the run is already past it; set train.max_steps "
                                  f"above {resumed_step} to train on, or use a new run_dir")
        saved = self.resumed_config = read_config(self.resume_from)
        changed = resume_config.changed_keys(saved, self.cfg)
        refused, applied = changed[resume_config.REFUSED], changed[resume_config.APPLIED]
        announced = changed[resume_config.ANNOUNCED]
        if refused:
            raise CheckpointError(f"cannot resume {self.run_dir} from {self.resume_from.name}: the config changes "
                                  f"what the checkpoint holds ({resume_config.describe(refused, saved, self.cfg)}); "
                                  "use a new run_dir (train.init_from=CHECKPOINT starts from its weights)")
        self.resume_changes = applied
        if applied:
            self.log(escape(f"resuming with changed optimizer settings: "
                            f"{resume_config.describe(applied, saved, self.cfg)}"), soft_wrap=True)
        if announced:
            self.log(escape(f"resuming with changed data settings: {resume_config.describe(announced, saved, self.cfg)}"
                            " (the batches from here differ from those of the run it continues)"), soft_wrap=True)

    def maybe_resume(self) -> None:
        if not self._resume_checked:
            self.check_resume()  # callers that build() without fit()
        found = self.resume_from
        if self.restart is not None:
            self.log(f"restart {self.restart[0]} after {self.restart[1]}: "
                     + (f"resuming from {found.name}" if found else "no checkpoint yet, starting from step 0"))
        if found is None:
            return
        # a checkpoint of another data-parallel size is reshaped (fsframework.train.resize)
        same = resume.load_engine(self.engine, found, cfg=self.cfg, world_size=self.dist.world_size,
                                   rank=self.dist.rank)
        client = resume.load_client_state(found, self.dist.rank, same_layout=same)
        self.state = TrainState(**client["train_state"])
        self.source.load_state_dict(client["loader"])
        resume.set_rng_state(client["rng"])
        if self.resume_changes:
            apply_optimizer_settings(self.optimizer_base, self.scheduler, self.resumed_config, self.cfg)
        self.resumed_from = self.last_checkpoint = found  # pruning never deletes it
        self.log(f"resumed from {found.name} at step {self.state.step}"
                 + ("" if same else f" (written by another number of ranks; now {self.dist.world_size})"))
        keep = self.cfg.train.keep_checkpoints
        self.log(f"{found.name} is kept beside the newest train.keep_checkpoints={keep} while this run lasts "
                 f"(up to {keep + 1} checkpoints); a later run that resumes from a newer one prunes it")

    def save(self) -> None:
        client = {"train_state": asdict(self.state), "loader": self.source.state_dict(), "rng": resume.rng_state()}
        self.last_checkpoint = writing.save(self.engine, self.ckpt_root, self.state.step, client, to_yaml(self.cfg),
                                            rank=self.dist.rank, keep=self.cfg.train.keep_checkpoints,
                                            tokenizer=self.tokenizer, protect=self.resumed_from)
        self.log(f"checkpoint at step {self.state.step}: {escape(str(self.last_checkpoint))}", soft_wrap=True)

    def losses(self, inputs: torch.Tensor, targets: torch.Tensor, weights: Optional[torch.Tensor] = None,
               doc_ids: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss to optimise, plain CE) of a micro-batch of whole sequences `[B, T]`: this rank's
        part of it (all of it on one process; its runs under sequence parallelism, scaled so that
        the ranks' losses average to the batch's, `fsframework.parallel.batch`) through the engine.
        doc_ids: the rows' packed documents, read apart under `data.document_masking`."""
        dev = self.engine.device
        # doc_ids stay on the host: the model builds its document tables there, once per batch (no sync)
        documents = doc_ids if self.cfg.data.document_masking else None
        mine = shard_batch(self.sp, inputs.to(dev), targets.to(dev), None if weights is None else weights.to(dev),
                           documents)
        return mine.scored(self.engine, self.cfg.train.loss_chunk)

    def forward_backward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(optimised loss, plain CE) of one micro-batch, gradients accumulated."""
        loss, plain = self.losses(batch["inputs"], batch["targets"], batch.get("weights"), batch.get("doc_ids"))
        self.engine.backward(loss)
        return loss.detach(), plain.detach()

    def _local_grad_norm(self) -> float | None:
        """Norm of the full gradients held by this rank (ZeRO 0 only; ZeRO 1-3 report their own)."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if self.cfg.parallel.zero_stage > 0 or not grads:
            return None
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))

    def train_step(self) -> dict[str, Any]:
        lr = self.optimizer.param_groups[0]["lr"]
        losses, plain_losses = [], []
        pre_step_norm, finite = None, True
        documents: list[int] = []  # the lengths of the documents read apart (document masking)
        self.clock.start()
        clocks = self._collective_clocks()
        for clock in clocks.values():
            clock.start()  # stopped again below: a validation's collectives are no step's
        for micro in range(self.cfg.parallel.grad_accum):
            batch = self.source.next_batch(self.state.step, micro)
            if self.cfg.data.document_masking and batch.get("doc_ids") is not None:
                documents += document_lengths(batch["doc_ids"])
            self.clock.lap("data")
            loss, plain = self.forward_backward(batch)
            losses.append(loss)
            plain_losses.append(plain)
            if self.engine.is_gradient_accumulation_boundary():
                both = self._mean_losses(losses, plain_losses)
                # the same on every rank (averaged): a non-finite loss anywhere skips the update everywhere
                finite = bool(torch.isfinite(both[0]))
                self.optimizer_base.skip_next = not finite
                pre_step_norm = self._local_grad_norm() if finite else None
            self.clock.lap("compute")  # on a GPU the finiteness check above waited for the device
            self.engine.step()
            self.clock.lap("optimizer")
        self.collective_laps = {name: clock.take() for name, clock in clocks.items()}
        grad_norm = self.engine.get_global_grad_norm()
        if grad_norm is None:
            grad_norm = pre_step_norm
        if not finite:
            grad_norm = None
        metrics = {"loss": float(both[0]), "lr": lr, "grad_norm": float(grad_norm) if grad_norm is not None else None,
                   "seq_len": batch["inputs"].shape[1], **self.source.record(self.state.step)}
        alias = metrics.pop("loss_alias", None)  # a warm-up's loss under its own name too
        if alias:
            metrics[alias] = metrics["loss"]
        if self.cfg.loss.recall_weighting:
            metrics["plain_loss"] = float(both[1])
        if documents:
            metrics["documents_per_row"] = len(documents) * metrics["seq_len"] / sum(documents)
            metrics["document_lengths"] = documents  # read off by the loop's FLOPs count, not logged
        return metrics

    def _collective_clocks(self) -> dict[str, CollectiveClock]:
        """The collectives a step times, by the name its share is logged under: the sequence-parallel
        exchanges when there are any, the gradient reduction where one call holds all of it."""
        clocks = {"collectives": SP_COLLECTIVES} if self.sp is not None else {}
        if self.grad_reduce is not None:
            clocks["grad_reduce"] = self.grad_reduce
        return clocks

    def _mean_losses(self, losses: list[torch.Tensor], plain_losses: list[torch.Tensor]) -> torch.Tensor:
        """[optimised loss, plain CE] of this step, averaged over micro-batches and ranks."""
        both = torch.stack([torch.stack(losses).mean(), torch.stack(plain_losses).mean()])
        if self.dist.world_size > 1:
            import torch.distributed as dist

            dist.all_reduce(both)
            both /= self.dist.world_size
        return both

    def validation_losses(self) -> dict[str, float]:
        """`val/loss`: mean cross entropy on the first `train.eval_batches` micro-batches of every
        stream's held-out split, weighted as the training mixture, and with several streams each
        stream's as `val/loss/<stream>` (`fsframework.train.validation`). Through the training
        loss path: the same for every model, sequence parallelism and ZeRO stage; averaged over
        all ranks."""
        cfg = self.cfg
        if not hasattr(self, "_val_sets"):
            self._val_sets = validation_sets(cfg)
        self.engine.eval()
        per_stream = []
        with torch.no_grad():
            for held_out in self._val_sets:
                losses = []
                for start in range(0, len(held_out.windows), cfg.data.micro_batch_size):
                    batch = held_out.batch(start, cfg.data.micro_batch_size)
                    losses.append(self.losses(batch["inputs"], batch["targets"], None, batch["doc_ids"])[1])
                per_stream.append(torch.stack(losses).mean().float())
        self.engine.train()
        loss = torch.stack(per_stream)
        if self.dist.world_size > 1:
            import torch.distributed as dist

            dist.all_reduce(loss)
            loss /= self.dist.world_size
        weights = torch.tensor([held_out.weight for held_out in self._val_sets], dtype=loss.dtype, device=loss.device)
        metrics = {"val/loss": float((loss * weights).sum())}
        if len(self._val_sets) > 1:
            metrics.update({f"val/loss/{held_out.label}": float(value)
                            for held_out, value in zip(self._val_sets, loss)})
        return metrics

    def check_finite(self, loss: float) -> None:
        """Apply `train.nonfinite` after a step (its update was already skipped when `loss` is not finite)."""
        apply_nonfinite_policy(loss, self.state, self.cfg.train, self.last_checkpoint, self.log)

    def resume_hint(self) -> str:
        if self.last_checkpoint is None:
            return "no checkpoint was written yet: a rerun starts from step 0"
        return f"a rerun resumes from {self.last_checkpoint} (step {int(self.last_checkpoint.name.split('_')[-1])})"

    def abort_line(self) -> str:
        return f"aborted by a second SIGINT during step {self.state.step + 1}, without a checkpoint: {self.resume_hint()}"

    def stop_on_request(self, stops: StopRequests, saved: bool) -> None:
        """At a step boundary: act on a signal any rank received (collective). Preemption saves
        a checkpoint (unless this step's was just written) and raises RunStopped(EXIT_PREEMPTED);
        SIGINT raises RunStopped(EXIT_INTERRUPTED) without saving."""
        with reraise_naming_rank(self.dist.rank, self.dist.world_size, self.cfg.parallel.timeout_s):
            request = stops.agree(self.dist.world_size, self.dist.device)
        if request == NONE:
            return
        step = self.state.step
        if request == PREEMPT:
            if not saved:
                self.save()
            self.log(f"[bold yellow]preempted[/] ({stops.signal_name}) at step {step}: saved "
                     f"{escape(str(self.last_checkpoint))}; exiting with code {EXIT_PREEMPTED} so the job can be "
                     f"requeued ({escape(self.resume_hint())})", soft_wrap=True)
            raise RunStopped(EXIT_PREEMPTED)
        assert request == INTERRUPT
        self.log(f"[bold yellow]interrupted[/] (SIGINT) at step {step}: {escape(self.resume_hint())}", soft_wrap=True)
        raise RunStopped(EXIT_INTERRUPTED)

    def early_stop(self, ppl: float) -> bool:
        """Record a validation perplexity; True when `train.early_stop_patience` evaluations in a
        row brought no new best. An improvement must beat the best by more than one part in a
        million (float noise is no progress)."""
        if ppl < self.state.best_val_ppl * (1 - 1e-6):
            self.state.best_val_ppl, self.state.evals_since_best = ppl, 0
        else:
            self.state.evals_since_best += 1
        patience = self.cfg.train.early_stop_patience
        return bool(patience) and self.state.evals_since_best >= patience

    def fit(self) -> TrainState:
        cfg = self.cfg
        # before build(): a signal while the engine and data are set up is acted on after the
        # first step, and data-loader workers forked here inherit the handlers instead of dying
        stops = StopRequests(cfg.train.preempt_signals)
        stops.install()
        try:
            self.check_resume()
            self.build()
            self.maybe_resume()
            # a second SIGINT ends the process from another thread, mid-step: its one line names
            # the checkpoint a rerun resumes from, said by the main rank only
            stops.abort_message, stops.report = self.abort_line, self.dist.is_main
            stops.before_abort = unlink_shared_memory
            return self._loop(stops)
        finally:
            stops.restore()
            if self.source is not None:  # None when build() failed before making it
                self.source.close()

    def _loop(self, stops: StopRequests) -> TrainState:
        cfg = self.cfg
        tokens_per_step = global_batch_sequences(cfg, self.dist.world_size) * cfg.data.seq_len
        peak = device_peak_tflops(self.dist.device, "bf16" if use_bf16(cfg) else "fp32", cfg.train.peak_tflops)
        # the whole model's FLOPs per token: step_record divides the step's work by every device, the
        # sequence-parallel ranks included
        flops = functools.lru_cache(lambda seq_len: training_flops_per_token(cfg.model, seq_len))
        monitor = Monitor(self.run, total_steps=cfg.train.max_steps, start_step=self.state.step,
                          enabled=self.dist.is_main, progress=cfg.train.progress, tensorboard=cfg.train.tensorboard,
                          config_yaml=to_yaml(cfg),
                          hparams=run_hparams(cfg, self.dist.world_size, self.num_parameters))
        profiler = StepProfiler(cfg.train.profile, self.dist.rank, self.run_dir / "profile", self.dist.device)
        stragglers = StragglerWatch(cfg.train.straggler_factor, cfg.train.straggler_intervals)
        self.engine.train()
        try:
            last = min(cfg.train.max_steps, cfg.train.stop_at_step or cfg.train.max_steps)
            if cfg.train.early_stop_patience and self.state.evals_since_best >= cfg.train.early_stop_patience:
                last = self.state.step  # a resumed run that had already stopped early
            while self.state.step < last:
                profiler.before_step(self.state.step + 1)
                start = time.perf_counter()
                with reraise_naming_rank(self.dist.rank, self.dist.world_size, cfg.parallel.timeout_s,
                                         self.state.step + 1):
                    metrics = self.train_step()
                elapsed = time.perf_counter() - start
                self.state.step += 1
                profiler.after_step(self.state.step)
                self.state.tokens += tokens_per_step
                stop = False
                if cfg.train.eval_every and self.state.step % cfg.train.eval_every == 0:
                    metrics.update(self.validation_losses())
                    metrics["val/ppl"] = math.exp(min(metrics["val/loss"], 80.0))
                    stop = self.early_stop(metrics["val/ppl"])
                    metrics["val/best_ppl"] = self.state.best_val_ppl
                if not math.isfinite(metrics["loss"]):
                    metrics["update_skipped"] = 1  # logged whatever train.nonfinite says, then acted on
                if (self.state.step % cfg.train.log_every == 0 or self.state.step == cfg.train.max_steps
                        or "val/loss" in metrics or not math.isfinite(metrics["loss"])):
                    lengths = metrics.pop("document_lengths", None)
                    # documents read apart cost what rows of their lengths cost
                    per_token = flops(metrics["seq_len"]) if lengths is None else packed_flops_per_token(lengths, flops)
                    figures = step_record(elapsed=elapsed, phases=self.clock.phases, tokens=tokens_per_step,
                                          flops_per_token=per_token, world_size=self.dist.world_size,
                                          peak_tflops=peak, memory=peak_memory_mb(self.dist.device),
                                          collectives={name: lap.seconds()
                                                       for name, lap in self.collective_laps.items()})
                    if self.dist.world_size > 1:  # every rank logs this step: every rank gathers
                        busy = elapsed - sum(lap.seconds() for lap in self.collective_laps.values())
                        ranks, warning = stragglers.observe(self.state.step, gather_busy_seconds(
                            busy, self.dist.device, self.dist.world_size))
                        figures.update(ranks)
                        if warning:
                            self.log(f"[yellow]{warning}[/yellow]")
                    if self.restart is not None:
                        figures["restarts"] = self.restart[0]
                    monitor.log({"step": self.state.step, **metrics, "tokens": self.state.tokens, **figures})
                else:
                    metrics.pop("document_lengths", None)
                    monitor.advance(self.state.step)
                self.check_finite(metrics["loss"])
                killed_here(self.dist.rank, self.state.step)  # a test's fault (restarts.KILL_ENV); else nothing
                saved = self.state.step % cfg.train.ckpt_every == 0 or self.state.step == last or stop
                if saved:
                    self.save()
                if stop:
                    self.log(f"early stop at step {self.state.step}: validation perplexity has not improved on "
                             f"{self.state.best_val_ppl:.3f} for {cfg.train.early_stop_patience} evaluations")
                    break
                if self.state.step < last:
                    self.stop_on_request(stops, saved)
            monitor.summary(self.state.step, self.state.tokens, self.last_checkpoint)
        finally:
            profiler.close()
            monitor.close()
        for trace in profiler.written:
            self.log(f"profile written: {trace}")
        return self.state


def check_step_memory(cfg: Config) -> None:
    """Before any work: a step's estimated peak memory against the device's, said by the main rank;
    a ConfigError (one line, naming what fits) when it does not fit (fsframework.train.memory_estimate).
    The device and the ranks come from the launcher's environment, as init_distributed reads them."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    # a CPU host's memory is shared by the ranks on it; a GPU's is its own rank's
    on_host = 1 if cuda else int(os.environ.get("LOCAL_WORLD_SIZE", world))
    main = os.environ.get("RANK", "0") == "0"
    check_memory(cfg, cuda=cuda, world_size=world, ranks_per_device=on_host, bf16=use_bf16(cfg),
                 log=(lambda line: console.print(escape(line), soft_wrap=True)) if main else (lambda line: None))


def train(cfg: Config) -> TrainState:
    check_trainable(cfg.model.name)  # a read path only (FS-B) has no training of its own
    check_step_memory(cfg)  # before the data, the run directory and the engine
    check_data_fits(cfg, heldout_for=f"train.eval_every={cfg.train.eval_every}" if cfg.train.eval_every else None)
    return Trainer(cfg).fit()
