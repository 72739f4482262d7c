"""Judge Spectrum's capacity predictions on two held-out sets of measured vLLM runs.

    python benchmarks/capacity-heldout/evaluate.py \\
        --aiconfigurator /work/.mirror/ai-dynamo+aiconfigurator/repo \\
        --sim-to-real /work/.mirror/inference-sim+sim-to-real-accuracy-validation/repo \\
        [--inference-sim /work/.mirror/inference-sim+inference-sim/repo] [--out DIR]

Each DIR is a git directory (bare, as the ``fetch`` tool leaves it) or a checked-out clone. The
held-out files are read from it at run time; nothing of theirs is stored in this repository, and
nothing here is fitted to them (FACTS.md §13). What this script does with them:

* ``normalise_aiconfigurator`` turns rows of AIConfigurator's ``silicon_sample.csv`` (one
  aggregated vLLM deployment at a fixed concurrency, fixed ISL/OSL, measured TTFT and TPOT) into
  closed-loop workloads.
* ``normalise_sim_to_real`` turns the sim-to-real repository's error records (one row per
  simulator × experiment × load stage × metric, with the vLLM measurement in ``actual``) into
  open-loop workloads: one per experiment and stage, its arrival rate and token lengths taken from
  that repository's own workload descriptions (``workload_specs``), since the per-experiment
  ``profile.yaml`` files are not published; with ``--inference-sim``, each workload's shared system
  prompt and multi-turn users from BLIS's copy of those profiles (``attach_workload_blocks``). The
  other simulators' predictions on the same rows are kept, so their errors can be reported on
  exactly the points Spectrum is scored on.
* ``evaluate`` runs each workload through ``cost.hardware.predict`` (``capacity_for`` then
  ``closed_loop`` or ``open_loop``) and ``summarise`` reports the median absolute relative error by
  metric, overall, by GPU and dense against MoE. Results go to ``--out`` (JSON + Markdown); they
  contain measured values, so the default folder is git-ignored.
"""
from __future__ import annotations

import argparse
import csv
import importlib
import inspect
import io
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterable

HERE = Path(__file__).resolve().parent

# --- which rows are in scope ---------------------------------------------------------------------

# GPU names as the two sets spell them → Spectrum's GPU table. Anything else is skipped.
GPU_NAMES = {
    "h100_sxm": "h100", "h100": "h100", "h200_sxm": "h200", "h200": "h200", "b200_sxm": "b200",
    "b200": "b200", "a100_sxm": "a100-80gb", "a100-80gb": "a100-80gb", "a100": "a100-80gb",
    "l40s": "l40s", "l4": "l4", "a10g": "a10g",
}

# Architecture families in scope, matched on the Hugging Face id (first match wins).
FAMILIES: list[tuple[str, str, bool]] = [   # (pattern, family, moe)
    (r"codellama", "codellama", False),
    (r"llama-?2", "llama-2", False),
    (r"llama-?3(\.\d)?", "llama-3", False),
    (r"mixtral", "mixtral", True),
    (r"mistral", "mistral", False),
    (r"(^|/)yi-", "yi", False),
    (r"qwen2\.5", "qwen2.5", False),
    (r"qwen3-[\d.]+b-a[\d.]+b", "qwen3-moe", True),
    (r"qwen3-", "qwen3", False),
    (r"gpt-oss", "gpt-oss", True),
    (r"gemma-?3", "gemma-3", False),
    (r"deepseek-(v3|r1)", "deepseek-v3", True),
    (r"kimi-k2", "deepseek-v3", True),        # Kimi K2 / K2.5: DeepSeek-V3's architecture
]
OUT_OF_SCOPE = [r"llama-4", r"minimax", r"glm", r"nemotron", r"qwen3\.5", r"deepseek-v3\.2", r"deepseek-v4"]


def family_of(model: str) -> tuple[str, bool] | None:
    """(family, is MoE) for a Hugging Face id in scope, else None."""
    name = model.lower()
    if any(re.search(p, name) for p in OUT_OF_SCOPE):
        return None
    for pattern, family, moe in FAMILIES:
        if re.search(pattern, name):
            return family, moe
    return None


# --- reading the held-out repositories -----------------------------------------------------------

class Repo:
    """Read files from a git directory (bare or ``.git``) or a checked-out folder, at HEAD or at an
    older commit (the sim-to-real repository's full results live only in its history)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        if not self.root.exists():
            raise SystemExit(f"{self.root}: no such folder")
        if (self.root / "HEAD").is_file() and (self.root / "objects").is_dir():
            self.git_dir, self.work = self.root, None
        elif (self.root / ".git").exists():
            self.git_dir, self.work = self.root / ".git", self.root
        else:
            self.git_dir, self.work = None, self.root

    def _git(self, *args: str) -> str | None:
        if self.git_dir is None:
            return None
        done = subprocess.run(["git", f"--git-dir={self.git_dir}", *args], capture_output=True, text=True)
        return done.stdout if done.returncode == 0 else None

    def head(self) -> str:
        out = self._git("rev-parse", "HEAD")
        return out.strip() if out else "working-tree"

    def read(self, path: str, rev: str | None = None) -> str | None:
        if rev is None and self.work is not None and (self.work / path).is_file():
            return (self.work / path).read_text()
        return self._git("show", f"{rev or 'HEAD'}:{path}")

    def last_commit_with(self, path: str) -> str | None:
        """The newest commit (on any branch) that added or changed ``path``: it holds the file even
        when a later commit deleted it."""
        out = self._git("log", "--all", "--format=%H", "-1", "--diff-filter=AM", "--", path)
        return (out.strip() or None) if out is not None else None

    def find(self, suffix: str) -> list[str]:
        if self.git_dir is not None:
            out = self._git("ls-tree", "-r", "--name-only", "HEAD") or ""
            return [p for p in out.splitlines() if p.endswith(suffix)]
        return [str(p.relative_to(self.root)) for p in self.root.rglob("*") if str(p).endswith(suffix)]


# --- AIConfigurator: silicon_sample.csv ----------------------------------------------------------

AIC_SAMPLE = "silicon_sample.csv"
AIC_MEASURED = {("ttft", "mean"): "silicon_ttft_ms", ("tpot", "mean"): "silicon_tpot_ms"}
# Requests per point, in rounds of the concurrency. The file does not say how many requests a
# point sent; AIConfigurator's own benchmark scripts send C × MULTI_ROUND (20 by default) with
# `aiperf profile --concurrency C`, after a warmup phase that AIPerf drains before it starts
# counting (src/aiconfigurator/generator/config/backend_templates/benchmark/bench_run.sh.j2 and
# generator/sflow.py at 095f58a51; aiperf 0.3.0 timing/credit_issuing_strategy.py). So the
# counted requests start from an empty server, C at once, and every one is in the means.
AIC_ROUNDS = 20


# The day AIConfigurator's generator began passing its engine flags to vLLM (its run script,
# commit 2cecd6596), and the PyPI release day of each vLLM version the undated rows name.
GENERATOR_FLAGS_SINCE = "2026-01-08"
VLLM_RELEASED = {"0.11.2": "2025-11-20", "0.12.0": "2025-12-03", "0.13.0": "2025-12-19",
                 "0.14.0": "2026-01-20", "0.15.0": "2026-01-29", "0.15.1": "2026-02-05"}


def by_the_generator(row: dict[str, str], version: str | None) -> bool:
    """Whether a point was measured on a deployment AIConfigurator's generator made with the
    flags it passes since GENERATOR_FLAGS_SINCE: its measurement date says so, or, undated, a vLLM
    released after that day (a version newer than the table's last is)."""
    found = re.search(r"measured=(\d{4}-\d{2}-\d{2})", row.get("silicon_data_source", ""))
    if found:
        return found.group(1) >= GENERATOR_FLAGS_SINCE
    if not version:
        return False
    if version in VLLM_RELEASED:
        return VLLM_RELEASED[version] >= GENERATOR_FLAGS_SINCE
    release = _release(version)                          # None: a pre-release or local build: unknown
    return release is not None and release > max(map(_release, VLLM_RELEASED))


def _release(version: str) -> tuple[int, ...] | None:
    """``0.14.0`` (or ``0.14.0.post1``) as (0, 14, 0); None where those three are not numbers."""
    try:
        return tuple(int(x) for x in version.split(".")[:3])
    except ValueError:
        return None


# vLLM turned async scheduling on by default in 0.14.0 (vllm/config/scheduler.py: ``async_scheduling``
# False in 0.13.0, None = on where supported in 0.14.0; read in both wheels).
ASYNC_SCHEDULING_SINCE = (0, 14, 0)


def async_by_default(version: str | None, row: dict[str, str] | None = None) -> bool:
    """Whether the vLLM a point ran scheduled asynchronously by default: its version says so, or, a
    nightly or local build, its measurement date is after 0.14.0's release. Unknown: False (a
    synchronous scheduler, as every vLLM before 0.14.0)."""
    release = _release(version) if version else None
    if release is not None:
        return release >= ASYNC_SCHEDULING_SINCE
    found = re.search(r"measured=(\d{4}-\d{2}-\d{2})", (row or {}).get("silicon_data_source", ""))
    return bool(found) and found.group(1) >= VLLM_RELEASED["0.14.0"]


def aic_kv_dtype(checkpoint_format: str | None) -> str:
    """The KV cache AIConfigurator's generator deploys: FP8 for a checkpoint quantized to FP8 or
    NVFP4, the model's own 16 bits otherwise. Its model reader gives such checkpoints an FP8 KV
    cache (aic-core sdk/models/helpers.py ``_infer_quant_modes_from_raw_config`` at 095f58a51:
    fp8, fp8_block and nvfp4 quantization → ``kvcache_quant_mode`` fp8), and the generator passes
    that mode to vLLM as ``--kv-cache-dtype`` (generator/module_bridge.py,
    config/backend_config_mapping.yaml). A 16-bit checkpoint served at a quantized
    ``gemm_quant_mode`` keeps the default."""
    return "fp8" if checkpoint_format in ("fp8", "fp4") else "auto"


def aic_engine_flags(concurrency: int, isl: int, osl: int) -> dict[str, int]:
    """The vLLM flags AIConfigurator's generator gives the deployment it benchmarks at C.

    Its benchmark rules (src/aiconfigurator/generator/rule_plugin/benchmark/vllm.rule at
    095f58a51, since 2026-01-30; the same token budget in its default rules since 2025-12-04)
    size one aggregated worker for the client: max_batch_size = C, max_num_tokens = C + ISL +
    1500, max_seq_len = ISL + OSL + 1500; generator/config/backend_config_mapping.yaml maps them
    to --max-num-seqs, --max-num-batched-tokens and --max-model-len, which the vLLM run script
    passes since 2cecd6596 (GENERATOR_FLAGS_SINCE). vLLM's own defaults (8,192 tokens a step on an
    H100/H200) let a wave of C prompts through in fewer, longer steps. Only for the points
    ``by_the_generator`` says were measured on such a deployment."""
    return {"max_num_seqs": concurrency, "max_num_batched_tokens": concurrency + isl + 1500,
            "max_model_len": isl + osl + 1500}


def _int(value: str | None) -> int | None:
    try:
        return int(float(value)) if value not in (None, "") else None
    except ValueError:
        return None


def _float(value: str | None) -> float | None:
    try:
        v = float(value) if value not in (None, "") else None
    except ValueError:
        return None
    return v if v is not None and math.isfinite(v) else None


QUANT_SUFFIX = re.compile(r"-(fp8(-dynamic)?|nvfp4|fp4|mxfp4)$", re.I)


def catalog_name(model: str) -> tuple[str, str | None]:
    """(the name to give the catalog, the weight format its suffix names): a quantized re-upload
    (``nvidia/Llama-3.1-8B-Instruct-FP8``, ``Qwen/Qwen3-235B-A22B-FP8``) has its base model's
    architecture, so it is looked up by the base name, without the publisher, with the format kept
    as the dtype."""
    found = QUANT_SUFFIX.search(model)
    if not found:
        return model, None
    base = model[:found.start()].rsplit("/", 1)[-1]
    fmt = found.group(1).lower()
    return base, "fp8" if fmt.startswith("fp8") else "fp4"


def _aic_dtype(model: str, quant: str) -> str | None:
    """Spectrum's ``dtype`` for AIConfigurator's ``gemm_quant_mode``; None when there is none."""
    quant = (quant or "").lower()
    native = re.search(r"-(fp8|fp4|nvfp4|awq|gptq)\b", model.lower()) or "gpt-oss" in model.lower()
    if native or quant in ("", "bf16", "float16", "fp16"):
        return "auto"                       # the checkpoint's own format (gpt-oss ships MXFP4)
    return {"fp8": "fp8", "fp8_block": "fp8", "fp8_static": "fp8", "nvfp4": "fp4", "mxfp4": "fp4",
            "int4_wo": "int4", "w4a16": "int4"}.get(quant)


def _aic_version(row: dict[str, str]) -> str | None:
    if row.get("backend_version"):
        return row["backend_version"]
    found = re.search(r"vllm-openai:v?([\w.\-]+)", row.get("silicon_data_source", ""))
    return found.group(1) if found else None


def normalise_aiconfigurator(rows: Iterable[dict[str, str]], source: str = "silicon_sample.csv"
                             ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Workloads (closed loop at ``batch_size`` concurrency) and skipped rows, each with a reason.

    A row is kept when it is vLLM, aggregated (one engine serving prefill and decode), on a GPU in
    Spectrum's table, with a model in scope, one plain tensor-parallel group (attention DP 1, the
    MoE split over the same GPUs) and both measurements present."""
    kept, skipped = [], []
    for i, row in enumerate(rows):
        rid = row.get("id") or f"row{i}"
        model = row.get("model_path", "")

        def skip(reason: str) -> None:
            skipped.append({"set": "aiconfigurator", "id": rid, "model": model, "gpu": row.get("system"),
                            "reason": reason})

        if row.get("backend") != "vllm":
            skip(f"backend {row.get('backend')!r}, not vLLM"); continue
        if row.get("mode") != "agg":
            skip(f"mode {row.get('mode')!r}: disaggregated prefill/decode is not one replica"); continue
        gpu = GPU_NAMES.get((row.get("system") or "").lower())
        if gpu is None:
            skip(f"GPU {row.get('system')!r} is not in Spectrum's GPU table"); continue
        fam = family_of(model)
        if fam is None:
            skip(f"model {model!r}: architecture not in scope"); continue
        tp = _int(row.get("tp_size")) or 1
        dp = _int(row.get("attention_dp_size")) or 1
        moe_tp, moe_ep = _int(row.get("moe_tp_size")) or 1, _int(row.get("moe_ep_size")) or 1
        if (_int(row.get("pp_size")) or 1) != 1:
            skip("pipeline parallelism"); continue
        if dp != 1:
            skip(f"attention data parallel {dp} (one engine over {tp * dp} GPUs)"); continue
        if fam[1] and moe_tp * moe_ep != tp:            # dense rows carry moe_tp = moe_ep = 1
            skip(f"layout tp {tp} × attention-dp {dp} ≠ moe_tp {moe_tp} × moe_ep {moe_ep}: not a plain TP group"); continue
        dtype = _aic_dtype(model, row.get("gemm_quant_mode", ""))
        if dtype is None:
            skip(f"weight format {row.get('gemm_quant_mode')!r} has no Spectrum dtype"); continue
        conc, isl, osl = _int(row.get("batch_size")), _int(row.get("isl")), _int(row.get("osl"))
        if not (conc and isl and osl):
            skip("concurrency, ISL or OSL missing"); continue
        measured = {f"{m}_{s}": _float(row.get(col)) for (m, s), col in AIC_MEASURED.items()}
        measured = {k: v for k, v in measured.items() if v is not None and v > 0}
        if not measured:
            skip("no measured TTFT/TPOT"); continue
        lookup, suffix_dtype = catalog_name(model)
        version = _aic_version(row)
        generated = by_the_generator(row, version)
        kept.append({
            "set": "aiconfigurator", "id": rid, "model": model, "catalog_model": lookup, "family": fam[0],
            "moe": fam[1], "gpu": gpu,
            "tp": tp, "dtype": suffix_dtype if dtype == "auto" and suffix_dtype else dtype,
            "kv_dtype": aic_kv_dtype(suffix_dtype) if generated else "auto",
            "engine": {**(aic_engine_flags(conc, isl, osl) if generated else {}),
                       "async_scheduling": async_by_default(version, row)}, "vllm_version": version,
            "load": {"kind": "closed", "concurrency": conc, "input_tokens": isl, "output_tokens": osl,
                     "requests": AIC_ROUNDS * conc},
            "measured": measured, "comparators": {}, "source": source,
            "notes": ([f"expert parallel {moe_ep} over the TP group"] if fam[1] and moe_ep > 1 else [])
                     + [f"AIC quant {row.get('gemm_quant_mode') or 'bf16'}/{row.get('moe_quant_mode') or '-'}"],
        })
    return kept, skipped


# --- sim-to-real: error records + the repository's workload descriptions ------------------------

# Result files in that repository: the one comparing all simulators on the 38 main experiments
# (in history only; .gitignore now drops results/error_records.csv) and the train/validation set
# BLIS's trained-physics mode was fitted on. Optional extra: the cluster run used for LLMServingSim.
S2R_RESULTS = [("results_iter36/error_records.csv", "main"), ("results_trainval/error_records.csv", "trainval")]
S2R_EXTRA = [("results/cluster_2000req/error_records.csv", "cluster")]
S2R_DESIGN = "docs/plans/2026-03-04-sim-to-real-accuracy-validation-design.md"
S2R_FIGURES_SPEC = "docs/superpowers/specs/2026-03-16-publication-figures-design.md"
BLIS_TRAINVAL_README = "training/trainval_data/README.md"
# BLIS's golden dataset of these experiments: per experiment, the inference-perf ``shared_prefix``
# block its profile ran (system prompt, question and output lengths, groups, multi-turn) beside
# BLIS's own predictions ("expected", never read here).
BLIS_GOLDEN = "testdata/trained_physics_iter29.json"
VLLM_BLOCK_TOKENS = 16      # vLLM's KV block on CUDA: the prefix cache serves whole blocks
S2R_METRICS = {"e2e_mean": ("e2e", "mean"), "e2e_p90": ("e2e", "p90"), "e2e_p99": ("e2e", "p99"),
               "ttft_mean": ("ttft", "mean"), "ttft_p90": ("ttft", "p90"), "ttft_p99": ("ttft", "p99"),
               "itl_mean": ("tpot", "mean")}
S2R_GPUS = {"H100": "h100", "A100-80GB": "a100-80gb", "L40S": "l40s", "H200": "h200", "B200": "b200"}


def parse_workload_table(design_md: str) -> tuple[dict[str, dict], dict[str, Any]]:
    """The workload table and the 'All experiments:' engine line of the sim-to-real design
    document: {workload: {input_tokens, output_tokens, stages: [{rate, duration}]}}, engine."""
    specs: dict[str, dict] = {}
    for line in design_md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not re.fullmatch(r"[a-z\-]+", cells[0]):
            continue
        tin, tout = (re.search(r"[\d,]+", c) for c in cells[1:3])
        rates = [float(r) for r in re.findall(r"(\d+(?:\.\d+)?)(?=\s*(?:→|->|req/s))", cells[3])]
        n_stages = re.search(r"(\d+)\s+stages?", cells[3])
        each = re.search(r"(\d+)s", cells[3])
        if not (tin and tout and rates and each):
            continue
        if n_stages and int(n_stages.group(1)) != len(rates):
            continue
        specs[cells[0]] = {"input_tokens": int(tin.group().replace(",", "")),
                           "output_tokens": int(tout.group().replace(",", "")),
                           "stages": [{"rate": r, "duration": float(each.group(1))} for r in rates],
                           "source": S2R_DESIGN}
    engine: dict[str, Any] = {}
    line = next((l for l in design_md.splitlines() if l.startswith("All experiments:")), "")
    for key in ("max_model_len", "max_num_seqs"):
        found = re.search(rf"{key}=(\d+)", line)
        if found:
            engine[key] = int(found.group(1))
    found = re.search(r"vLLM v?([\d.]+)", line)
    if found:
        engine["vllm_version"] = found.group(1)
    return specs, engine


def parse_general_lite(spec_md: str, general: dict | None) -> dict | None:
    """'General-Lite (same token distributions as General at N rps peak …)': General's lengths,
    and only the peak (last) stage's rate is known."""
    found = re.search(r"General-Lite \(same token distributions as General at (\d+(?:\.\d+)?) rps peak", spec_md)
    if not (found and general):
        return None
    n = len(general["stages"])
    stages = [None] * (n - 1) + [{"rate": float(found.group(1)), "duration": general["stages"][-1]["duration"]}]
    return {"input_tokens": general["input_tokens"], "output_tokens": general["output_tokens"], "stages": stages,
            "source": f"{S2R_FIGURES_SPEC} (rate of the peak stage only)"}


def parse_reasoning_lite(readme_md: str, reasoning: dict | None) -> dict | None:
    """BLIS's train/validation README: 'System prompt (A tokens) + question (B tokens) + output
    (C tokens)' at 'R req/s'; one stage, as the reasoning workload it replaced."""
    found = re.search(r"System prompt \((\d+) tokens\) \+ question \((\d+) tokens\) \+ output \((\d+) tokens\)", readme_md)
    rate = re.search(r"reasoning-lite\*\*:.*?(\d+(?:\.\d+)?) req/s", readme_md)
    if not (found and rate):
        return None
    duration = reasoning["stages"][0]["duration"] if reasoning else None
    if duration is None:
        return None
    return {"input_tokens": int(found.group(1)) + int(found.group(2)), "output_tokens": int(found.group(3)),
            "stages": [{"rate": float(rate.group(1)), "duration": duration}],
            "source": f"inference-sim {BLIS_TRAINVAL_README}"}


def golden_experiments(golden_json: str) -> list[dict[str, Any]]:
    """The experiments of BLIS's golden dataset (``BLIS_GOLDEN``); none where it cannot be read."""
    try:
        return list(json.loads(golden_json).get("experiments", []))
    except (ValueError, AttributeError, TypeError):
        return []


def attach_workload_blocks(experiments: list[dict[str, Any]], specs: dict[str, dict]) -> int:
    """What BLIS's golden dataset records of each workload's inference-perf ``shared_prefix``
    block (read from each run's own profile), matched by its system prompt + question and output
    lengths (general: 100 + 447 / 248, as the design document's ~547 / ~248): the shared system
    prompt's length (``system_prompt_tokens``) and, for multi-turn chat, the users
    (``users``: system prompts × users a prompt), each of whom sends a turn only after its
    previous answer. Sets them on the specs it matches; returns how many."""
    blocks = {}
    for e in experiments:
        sp = ((e.get("workload") or {}).get("inference_perf") or {}).get("shared_prefix") or {}
        if {"system_prompt_len", "question_len", "output_len"} <= set(sp):
            users = (int(sp.get("num_unique_system_prompts") or 1) * int(sp.get("num_users_per_system_prompt") or 1)
                     if sp.get("enable_multi_turn_chat") else None)
            blocks[(sp["system_prompt_len"] + sp["question_len"], sp["output_len"])] = (sp["system_prompt_len"], users)
    matched = 0
    for spec in specs.values():
        block = blocks.get((spec["input_tokens"], spec["output_tokens"]))
        if block is not None:
            spec["system_prompt_tokens"] = block[0]
            if block[1]:
                spec["users"] = block[1]
            matched += 1
    return matched


def system_prompt_reuse(spec: dict) -> float:
    """The share of each prompt vLLM's prefix cache serves from the group's shared system prompt
    (its whole KV blocks): the reuse the workload guarantees once a group's first request has run.
    0 where the system prompt is not published."""
    system = spec.get("system_prompt_tokens") or 0
    return (system // VLLM_BLOCK_TOKENS) * VLLM_BLOCK_TOKENS / spec["input_tokens"]


def kv_cache_checks(experiments: list[dict[str, Any]], engine: dict[str, Any], api: Any) -> list[dict[str, Any]]:
    """vLLM's logged KV cache of each sim-to-real deployment BLIS's golden dataset records
    (``total_kv_blocks`` × 16 tokens) beside the memory arithmetic's prediction for the same model,
    GPU, TP and engine flags (memory utilization 0.9, vLLM's default: the records leave it empty).
    A check of ``cost capacity``'s KV figure, never fitted; models out of the catalog are left out."""
    out = []
    for e in experiments:
        gpu = S2R_GPUS.get(e.get("hardware", ""))
        if not (gpu and e.get("total_kv_blocks") and family_of(e.get("model", ""))):
            continue
        try:
            _, details = api.capacity_for(e["model"], gpu=gpu, tp=e["tp"], max_num_seqs=e.get("max_num_seqs"),
                                          max_num_batched_tokens=e.get("max_num_batched_tokens"),
                                          max_model_len=engine.get("max_model_len"))
        except Exception:                               # noqa: BLE001 — out of scope: left out
            continue
        logged = VLLM_BLOCK_TOKENS * e["total_kv_blocks"]
        out.append({"id": e["id"], "model": e["model"], "gpu": gpu, "tp": e["tp"], "logged_tokens": logged,
                    "predicted_tokens": details["kv_cache_tokens"],
                    "error": details["kv_cache_tokens"] / logged - 1})
    return out


def workload_of(folder: str, labelled: str) -> str:
    """The workload name from the experiment folder (the trainval file labels general-lite as
    general and reasoning-lite as reasoning; the folder keeps the difference)."""
    name = folder.rsplit("/", 1)[-1]
    for w in ("general-lite", "reasoning-lite", "general", "codegen", "roleplay", "reasoning"):
        if re.search(rf"-tp\d+-{w}(-|$)", name):
            return w
    return labelled


def normalise_sim_to_real(records: Iterable[dict[str, str]], specs: dict[str, dict], engine: dict[str, Any],
                          source: str = "error_records.csv", seen: set[str] | None = None,
                          subset: str = "main") -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One open-loop workload per (experiment, stage) of the error records; ``stage -1`` (the
    whole run, the level the repository's figures report) when every stage's rate is known.
    ``seen`` holds experiment folder names already taken from an earlier file (skipped here)."""
    groups: dict[tuple[str, int], list[dict[str, str]]] = defaultdict(list)
    for r in records:
        groups[(r["experiment_folder"].rsplit("/", 1)[-1], int(float(r["stage_index"])))].append(r)
    kept, skipped = [], []
    for (exp, stage), rows in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        first = rows[0]
        model = first["model"]
        rid = f"{exp}/stage{stage}"

        def skip(reason: str) -> None:
            skipped.append({"set": "sim-to-real", "id": rid, "model": model, "gpu": first.get("hardware"),
                            "reason": reason})

        if seen is not None and exp in seen:
            continue                                    # taken from an earlier file, silently
        gpu = S2R_GPUS.get(first.get("hardware", ""))
        if gpu is None:
            skip(f"GPU {first.get('hardware')!r} is not in Spectrum's GPU table"); continue
        fam = family_of(model)
        if fam is None:
            skip(f"model {model!r}: architecture not in scope"); continue
        if (_int(first.get("dp")) or 1) > 1:
            skip(f"data parallel {first.get('dp')}: several engines behind one endpoint"); continue
        if (first.get("precision") or "FP16").upper() not in ("FP16", "BF16"):
            skip(f"precision {first.get('precision')}"); continue
        workload = workload_of(exp, first.get("workload", ""))
        spec = specs.get(workload)
        if spec is None:
            skip(f"workload {workload!r}: no published description of its lengths and rates"); continue
        if stage >= 0:
            if stage >= len(spec["stages"]) or spec["stages"][stage] is None:
                skip(f"workload {workload!r} stage {stage}: its arrival rate is not published"); continue
            stages = [spec["stages"][stage]]
        else:
            if any(s is None for s in spec["stages"]):
                skip(f"workload {workload!r}: whole-run row needs every stage's rate, not all published"); continue
            stages = spec["stages"]
        measured, comparators = {}, defaultdict(dict)
        for r in rows:
            ms = S2R_METRICS.get(r["metric_name"])
            actual = _float(r.get("actual"))
            if ms is None or actual is None or actual <= 0:
                continue
            key = f"{ms[0]}_{ms[1]}"
            measured[key] = actual
            predicted = _float(r.get("predicted"))
            if predicted is not None:
                comparators[r["simulator"]][key] = predicted
        if not measured:
            skip("no measured latency"); continue
        flags = {"max_num_batched_tokens": _int(first.get("max_num_batched_tokens")),
                 "max_num_seqs": engine.get("max_num_seqs"), "max_model_len": engine.get("max_model_len"),
                 "gpu_memory_utilization": _float(first.get("gpu_mem_util")) or 0.9}
        reuse = system_prompt_reuse(spec)
        if reuse:
            flags["prefix_cache_hit_rate"] = round(reuse, 4)
            notes = [f"workload {workload}: {spec['source']}",
                     f"a system prompt of {spec['system_prompt_tokens']} tokens shared by each group of users "
                     f"({BLIS_GOLDEN} in inference-sim): the prefix cache serves its whole blocks, {reuse:.1%} of "
                     "every prompt; the history multi-turn sessions re-send is not credited (inference-perf's code "
                     "of the time re-sends it whole, which would outgrow max_model_len by the sixth turn, yet later "
                     "turns completed: what the runs' turns carried is not known)"]
        else:
            notes = [f"workload {workload}: {spec['source']}", "prefix caching on in the run (shared system prompt), "
                     "multi-turn sessions; predicted without prefix reuse (the system prompt's length is not found)"]
        if str(first.get("cpu_offload")).lower() == "true":
            notes.append("CPU KV offload on in the run (not modelled)")
        sessions = {"sessions": spec["users"]} if spec.get("users") else {}
        if sessions:
            notes.append(f"multi-turn chat: {spec['users']} users, each sending its next turn after its previous "
                         "answer, the wait in no latency (inference-perf's user sessions: the request's clock starts "
                         "once the user's previous turn has ended)")
        kept.append({
            "set": "sim-to-real", "subset": subset, "id": rid, "experiment": exp, "stage": stage, "workload": workload,
            "model": model, "family": fam[0], "moe": fam[1], "gpu": gpu, "tp": _int(first.get("tp")) or 1,
            "dtype": "auto", "kv_dtype": "auto",
            "engine": {**{k: v for k, v in flags.items() if v is not None},
                       "async_scheduling": async_by_default(engine.get("vllm_version"))},
            "vllm_version": engine.get("vllm_version"),
            "load": {"kind": "open", "input_tokens": spec["input_tokens"], "output_tokens": spec["output_tokens"],
                     "stages": stages, **sessions},
            "measured": measured, "comparators": dict(comparators), "source": source, "notes": notes,
        })
    return kept, skipped


def read_golden(blis: Repo) -> tuple[list[dict[str, Any]], str]:
    """BLIS's golden dataset, read once: its experiments and the commit they were read at."""
    rev = blis.last_commit_with(BLIS_GOLDEN)
    return golden_experiments(blis.read(BLIS_GOLDEN, rev) or ""), (rev or blis.head())[:10]


def load_sim_to_real(repo: Repo, blis: Repo | None, extra: bool,
                     golden: tuple[list[dict[str, Any]], str] | None = None
                     ) -> tuple[list[dict], list[dict], list[str], dict[str, Any]]:
    """The sim-to-real workloads, skipped rows and sources, and the design document's engine line.
    ``golden``: BLIS's golden dataset as ``read_golden`` gives it (read here when not given)."""
    design = repo.read(S2R_DESIGN)
    if design is None:
        raise SystemExit(f"{repo.root}: {S2R_DESIGN} not found (is this the sim-to-real repository?)")
    specs, engine = parse_workload_table(design)
    lite = parse_general_lite(repo.read(S2R_FIGURES_SPEC) or "", specs.get("general"))
    if lite:
        specs["general-lite"] = lite
    if blis is not None:
        rev = blis.last_commit_with(BLIS_TRAINVAL_README)
        text = blis.read(BLIS_TRAINVAL_README, rev) if rev else blis.read(BLIS_TRAINVAL_README)
        rl = parse_reasoning_lite(text or "", specs.get("reasoning"))
        if rl:
            specs["reasoning-lite"] = rl
        experiments, at = golden or read_golden(blis)
        if attach_workload_blocks(experiments, specs):
            for spec in specs.values():
                if "system_prompt_tokens" in spec:
                    spec["source"] += f"; system prompt: inference-sim {BLIS_GOLDEN}@{at}"
    kept, skipped, sources, seen = [], [], [], set()
    for path, label in S2R_RESULTS + (S2R_EXTRA if extra else []):
        rev = repo.last_commit_with(path)
        text = repo.read(path, rev) if rev else repo.read(path)
        if text is None:
            skipped.append({"set": "sim-to-real", "id": path, "reason": "file not found in this checkout"})
            continue
        where = f"{path}@{(rev or repo.head())[:10]} ({label})"
        k, s = normalise_sim_to_real(csv.DictReader(io.StringIO(text)), specs, engine, where, seen, label)
        seen |= {w["experiment"] for w in k} | {x["id"].split("/")[0] for x in s}
        kept += k
        skipped += s
        sources.append(where)
    return kept, skipped, sources, engine


def attach_aiconfigurator_predictions(workloads: list[dict], rows: Iterable[dict[str, str]]) -> int:
    """AIConfigurator's own predictions for the same rows, as its tool writes them
    (``tools/accuracy_regression_testing/predict_silicon_sample.py --aic-output-prefix P``: the
    sample's columns plus ``P_predicted_ttft_ms`` / ``P_predicted_tpot_ms``), matched by ``id``."""
    by_id = {w["id"]: w for w in workloads if w["set"] == "aiconfigurator"}
    matched = 0
    for row in rows:
        w = by_id.get(row.get("id"))
        if w is None:
            continue
        got = {}
        for col, value in row.items():
            found = re.fullmatch(r"(\w+)_predicted_(ttft|tpot)_ms", col or "")
            v = _float(value)
            if found and v is not None and f"{found.group(2)}_mean" in w["measured"]:
                got.setdefault(f"aiconfigurator ({found.group(1)})", {})[f"{found.group(2)}_mean"] = v
        for sim, values in got.items():
            w["comparators"][sim] = values
        matched += bool(got)
    return matched


def load_aiconfigurator(repo: Repo) -> tuple[list[dict], list[dict], list[str]]:
    paths = sorted(repo.find(AIC_SAMPLE))
    if not paths:
        raise SystemExit(f"{repo.root}: no {AIC_SAMPLE} (is this ai-dynamo/aiconfigurator?)")
    text = repo.read(paths[0])
    where = f"{paths[0]}@{repo.head()[:10]}"
    kept, skipped = normalise_aiconfigurator(csv.DictReader(io.StringIO(text)), where)
    return kept, skipped, [where]


# --- predicting ----------------------------------------------------------------------------------

# FACTS §13: vLLM's prefill reaches ~26-47 % of a Hopper GPU's dense peak. A closed loop whose
# prompts alone would need more than this share did not compute them all.
PREFILL_SHARE_CEILING = 0.5


def implied_prompt_compute(workloads: list[dict[str, Any]], api: Any) -> list[dict[str, Any]]:
    """For each AIConfigurator closed loop with both TTFT and TPOT measured: the share of its GPUs'
    dense peak its prompts alone would take if every prompt token were computed. The rate is the
    measured one (C requests in flight, each lasting TTFT + (OSL − 1) × TPOT); a prompt token costs
    2 FLOPs an active weight (attention left out, so the share is a floor); the peak is TP × the
    GPU's at the weights' format (16-bit where it has no instruction for it). Only measurements and
    spec sheets enter, no prediction. Above ``PREFILL_SHARE_CEILING`` the prompts were not all
    computed (vLLM's prefix cache serving prompts a client sent again: AIPerf draws every request
    from a pool of 100 unless told otherwise) or the run differed from its description."""
    out, specs = [], {}
    for w in workloads:
        load, measured = w["load"], w["measured"]
        if w["set"] != "aiconfigurator" or not {"ttft_mean", "tpot_mean"} <= set(measured):
            continue
        key = (w.get("catalog_model") or w["model"], w["gpu"], w["tp"], w["dtype"])
        if key not in specs:
            try:
                specs[key] = api.capacity_for(key[0], gpu=key[1], tp=key[2], dtype=key[3])[1]
            except Exception:                           # noqa: BLE001 — a model that does not fit: no check
                specs[key] = None
        details = specs[key]
        if details is None:
            continue
        tflops = details["hardware"]["tflops"]
        peak = 1e12 * details["hardware"]["tp"] * (tflops.get(details["model"]["dtype"]) or tflops["bf16"])
        e2e_s = (measured["ttft_mean"] + (load["output_tokens"] - 1) * measured["tpot_mean"]) / 1e3
        flops = load["concurrency"] / e2e_s * load["input_tokens"] * 2 * details["model"]["active_params"]
        out.append({"id": w["id"], "model": w["model"], "gpu": w["gpu"], "tp": w["tp"], "dtype": details["model"]["dtype"],
                    "concurrency": load["concurrency"], "input_tokens": load["input_tokens"],
                    "output_tokens": load["output_tokens"], "share_of_peak": flops / peak})
    return out


def _accepts(fn: Callable, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def predict(workload: dict[str, Any], api: Any, cache: dict, max_requests: int, seed: int = 0) -> dict[str, float]:
    """Spectrum's figures for one workload, keyed like ``measured`` (``ttft_mean``, ``e2e_p99`` …)."""
    load = workload["load"]
    kwargs = dict(model=workload.get("catalog_model") or workload["model"], gpu=workload["gpu"], tp=workload["tp"], dtype=workload["dtype"],
                  kv_dtype=workload["kv_dtype"], **workload["engine"])
    if _accepts(api.capacity_for, "input_tokens"):
        kwargs.update(input_tokens=load["input_tokens"], output_tokens=load["output_tokens"])
    key = json.dumps(kwargs, sort_keys=True)
    if key not in cache:
        try:
            cache[key] = ("ok", api.capacity_for(**kwargs))
        except Exception as exc:                        # noqa: BLE001 — a refusal is a skip reason
            cache[key] = ("error", f"{type(exc).__name__}: {exc}")
    status, value = cache[key]
    if status == "error":
        raise RuntimeError(value)
    cap, _details = value
    if load["kind"] == "closed":
        c = load["concurrency"]
        kw = {}
        if load.get("requests") and _accepts(api.closed_loop, "steady_state"):
            # the benchmark's own requests from an empty server, every one counted as its client does
            kw.update(requests=load["requests"], steady_state=False)
        elif _accepts(api.closed_loop, "requests"):    # steady state needs more than 2C (ramp and drain cut)
            kw["requests"] = max(3 * c, min(max(10 * c, 200), max_requests))
        if load.get("answer_spread"):
            kw.update(answer_spread=load["answer_spread"], seed=seed)
        res = api.closed_loop(cap, concurrency=c, input_tokens=load["input_tokens"],
                              output_tokens=load["output_tokens"], **kw)
        out = {}
        for m in ("ttft", "tpot", "e2e"):
            for s in ("mean", "p50", "p90", "p99"):
                v = res.get(f"{m}_ms", {}).get(s)
                if v is not None:
                    out[f"{m}_{s}"] = float(v)
        out["output_tok_s"] = res.get("output_tok_s")
        return out
    # open loop: each stage from an empty server; the whole run weights stages by their requests
    per_stage, weights = [], []
    for st in load["stages"]:
        n = max(1, min(max_requests, int(round(st["rate"] * st["duration"]))))
        kw = dict(rate_per_s=st["rate"], input_tokens=load["input_tokens"], output_tokens=load["output_tokens"],
                  requests=n)
        if _accepts(api.open_loop, "seed"):
            kw["seed"] = seed
        if load.get("sessions") and _accepts(api.open_loop, "sessions"):
            kw["sessions"] = load["sessions"]        # each stage's users, from an empty server
        per_stage.append(api.open_loop(cap, **kw))
        weights.append(st["rate"] * st["duration"])
    out: dict[str, float] = {}
    total = sum(weights)
    for m in ("ttft", "e2e"):
        means = [r[f"{m}_ms"]["mean"] for r in per_stage]
        if all(v is not None for v in means):
            out[f"{m}_mean"] = sum(w * v for w, v in zip(weights, means)) / total
        if len(per_stage) == 1:                          # percentiles of a mix of stages are not sums
            for s in ("p50", "p90", "p99"):
                v = per_stage[0][f"{m}_ms"].get(s)
                if v is not None:
                    out[f"{m}_{s}"] = float(v)
    if "e2e_mean" in out and "ttft_mean" in out:
        # the sim-to-real 'itl_mean': (E2E mean − TTFT mean) / (mean output tokens − 1)
        out["tpot_mean"] = (out["e2e_mean"] - out["ttft_mean"]) / max(load["output_tokens"] - 1, 1)
    return out


def evaluate(workloads: list[dict[str, Any]], api: Any, max_requests: int = 3000, limit: int | None = None,
             log: Callable[[str], None] = lambda s: None) -> tuple[list[dict], list[dict]]:
    """(scored rows: one per workload × measured metric, skipped workloads with the reason)."""
    rows, skipped, cache = [], [], {}
    for i, w in enumerate(workloads[:limit] if limit else workloads):
        t0 = time.time()
        try:
            pred = predict(w, api, cache, max_requests)
        except Exception as exc:                        # noqa: BLE001
            skipped.append({"set": w["set"], "id": w["id"], "model": w["model"], "gpu": w["gpu"],
                            "reason": f"predictor: {str(exc).splitlines()[0][:300]}"})
            continue
        for metric, measured in sorted(w["measured"].items()):
            p = pred.get(metric)
            if p is None:
                skipped.append({"set": w["set"], "id": f"{w['id']}:{metric}", "model": w["model"], "gpu": w["gpu"],
                                "reason": f"no predicted {metric} for this load (a whole-run percentile)"})
                continue
            rows.append({"set": w["set"], "subset": w.get("subset"), "id": w["id"], "model": w["model"], "family": w["family"],
                         "moe": w["moe"], "gpu": w["gpu"], "tp": w["tp"], "dtype": w["dtype"],
                         "stage": w.get("stage"), "workload": w.get("workload"), "load": w["load"],
                         "metric": metric, "predicted": p, "measured": measured,
                         "ape": abs(p - measured) / measured,
                         "comparators": {sim: {"predicted": v[metric], "ape": abs(v[metric] - measured) / measured}
                                         for sim, v in w.get("comparators", {}).items() if v.get(metric) is not None}})
        log(f"[{i + 1}/{len(workloads)}] {w['id']} {w['model']} {w['gpu']} tp{w['tp']} ({time.time() - t0:.1f}s)")
    return rows, skipped


# --- summaries -----------------------------------------------------------------------------------

def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median absolute relative error (and n) by metric: overall, by set, by GPU, dense vs MoE; and
    for each other simulator whose predictions came with the rows (all of sim-to-real's; on the
    AIConfigurator set, its own tool's when given), its median on the rows both predicted."""
    def table(key: Callable[[dict], str]) -> dict[str, dict[str, dict[str, Any]]]:
        out: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for r in rows:
            out[key(r)][r["metric"]].append(r["ape"])
        return {g: {m: {"median_ape": _median(v), "n": len(v)} for m, v in sorted(ms.items())}
                for g, ms in sorted(out.items())}

    summary = {
        "overall": table(lambda r: "all"),
        "by_set": table(lambda r: r["set"] + (f" ({r['subset']})" if r.get("subset") else "")),
        "by_gpu": table(lambda r: f"{r['set']}:{r['gpu']}"),
        "dense_vs_moe": table(lambda r: f"{r['set']}:{'moe' if r['moe'] else 'dense'}"),
    }
    # like for like: the other simulators on exactly the rows both predicted
    pairs: dict[tuple[str, str, str], list[tuple[float, float]]] = defaultdict(list)
    for r in rows:
        for sim, c in r.get("comparators", {}).items():
            level = ("closed loop" if r["load"]["kind"] == "closed" else
                     ("whole-run" if r.get("stage") == -1 else "per-stage") + f", {r.get('subset')}")
            pairs[(sim, level, r["metric"])].append((r["ape"], c["ape"]))
    summary["comparators"] = {
        f"{sim} [{level}]": {m: {"n": len(v), "spectrum_median_ape": _median([a for a, _ in v]),
                                 "their_median_ape": _median([b for _, b in v])}
                             for (s2, l2, m), v in sorted(pairs.items()) if s2 == sim and l2 == level}
        for sim, level in sorted({(s, l) for s, l, _ in pairs})}
    return summary


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


HEADLINE = ("ttft_mean", "tpot_mean", "e2e_mean", "ttft_p90", "e2e_p90", "ttft_p99", "e2e_p99")


def markdown(rows: list[dict], skipped: list[dict], summary: dict, sources: list[str], when: str) -> str:
    lines = [f"# Spectrum on the held-out sets ({when})", "", "Sources: " + "; ".join(f"`{s}`" for s in sources), ""]
    for title, key in (("Overall", "overall"), ("By set", "by_set"), ("By GPU", "by_gpu"),
                       ("Dense vs MoE", "dense_vs_moe")):
        groups = summary[key]
        metrics = [m for m in HEADLINE if any(m in g for g in groups.values())]
        lines += [f"## {title}: median |predicted − measured| / measured (n)", "",
                  "| group | " + " | ".join(metrics) + " |", "|---|" + "---|" * len(metrics)]
        for g, ms in groups.items():
            lines.append(f"| {g} | " + " | ".join(f"{_pct(ms[m]['median_ape'])} ({ms[m]['n']})" if m in ms else "—"
                                                   for m in metrics) + " |")
        lines.append("")
    if summary["comparators"]:
        lines += ["## Other simulators on the same rows (median APE, Spectrum vs them, n)", "",
                  "| simulator [level] | metric | n | Spectrum | them |", "|---|---|---|---|---|"]
        for sim, ms in summary["comparators"].items():
            for m in HEADLINE:
                if m in ms:
                    v = ms[m]
                    lines.append(f"| {sim} | {m} | {v['n']} | {_pct(v['spectrum_median_ape'])} | "
                                 f"{_pct(v['their_median_ape'])} |")
        lines.append("")
    lines += ["## Every scored point", "", "| set | id | model | GPU | TP | load | metric | predicted | measured | error |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ld = r["load"]
        load = (f"c={ld['concurrency']} {ld['input_tokens']}/{ld['output_tokens']}" if ld["kind"] == "closed" else
                "+".join(f"{s['rate']:g}/s" for s in ld["stages"]) + f" {ld['input_tokens']}/{ld['output_tokens']}")
        lines.append(f"| {r['set']} | {r['id']} | {r['model']} | {r['gpu']} | {r['tp']} | {load} | {r['metric']} | "
                     f"{r['predicted']:.1f} | {r['measured']:.1f} | {_pct(r['ape'])} |")
    reasons: dict[str, int] = defaultdict(int)
    for s in skipped:
        reasons[s["reason"][:160]] += 1
    lines += ["", f"## Skipped ({len(skipped)})", "", "| reason | count |", "|---|---|"]
    lines += [f"| {r} | {n} |" for r, n in sorted(reasons.items(), key=lambda kv: -kv[1])]
    return "\n".join(lines) + "\n"


def coverage(workloads: list[dict]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for w in workloads:
        out[w["set"]][w["gpu"]] += 1
    return {s: dict(g) for s, g in out.items()}


def what_if_answer_spread(workloads: list[dict[str, Any]], spread: float) -> list[dict[str, Any]]:
    """AIConfigurator's closed loops with their answers' lengths spread by ``spread`` (uniform,
    same mean) instead of identical: how much their figures hang on the simulator keeping loops of
    identical requests in step, which the servers, as far as the numbers tell, did not."""
    from options.core import BadInput

    if not 0 < spread < 2:
        raise BadInput(f"--what-if-answer-spread {spread!r} must lie between 0 and 2 (a share of the answer's length)")
    return [{**w, "load": {**w["load"], "answer_spread": spread},
             "notes": w["notes"] + [f"what-if: answers' lengths spread by {spread:g} (the runs' were identical)"]}
            if w["set"] == "aiconfigurator" and w["load"]["kind"] == "closed" else w for w in workloads]


def what_if_prefix_reuse(workloads: list[dict[str, Any]], hit_rate: float) -> list[dict[str, Any]]:
    """The sim-to-real workloads as if vLLM's prefix cache served ``hit_rate`` of every prompt:
    how much their figures hang on the one share those runs did not publish. Each says so in its
    notes; the headline figures are without it."""
    from cost.simulate.capacity import check_hit_rate

    check_hit_rate(hit_rate, "--what-if-prefix-hit-rate")
    return [{**w, "engine": {**w["engine"], "prefix_cache_hit_rate": hit_rate},
             "notes": w["notes"] + [f"what-if: prefix-cache hit rate {hit_rate:g} (not published)"]}
            for w in workloads]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--aiconfigurator", metavar="DIR", help="ai-dynamo/aiconfigurator (git dir or clone)")
    ap.add_argument("--sim-to-real", metavar="DIR", help="inference-sim/sim-to-real-accuracy-validation")
    ap.add_argument("--inference-sim", metavar="DIR",
                    help="inference-sim/inference-sim: its history describes the reasoning-lite workload")
    ap.add_argument("--aiconfigurator-predictions", metavar="CSV",
                    help="AIConfigurator's own predictions of the sample (its predict_silicon_sample.py output)")
    ap.add_argument("--with-cluster-run", action="store_true",
                    help="also take experiments found only in sim-to-real's cluster_2000req records")
    ap.add_argument("--out", default=str(HERE / "results"), help="where results.json and results.md go")
    ap.add_argument("--predictor", default="cost.hardware.predict", help="module with capacity_for/closed_loop/open_loop")
    ap.add_argument("--max-requests", type=int, default=3000, help="cap on simulated requests per open-loop stage")
    ap.add_argument("--limit", type=int, help="score only the first N workloads (a quick look)")
    ap.add_argument("--list", action="store_true", help="normalise and print coverage only; predict nothing")
    ap.add_argument("--what-if-answer-spread", type=float, metavar="F",
                    help="a sensitivity, not a result: predict AIConfigurator's closed loops with their answers' "
                         "lengths spread by F (uniform, same mean) instead of identical. Never use it to choose "
                         "a constant")
    ap.add_argument("--what-if-prefix-hit-rate", type=float, metavar="F",
                    help="a sensitivity, not a result: predict the sim-to-real runs as if vLLM's prefix cache had "
                         "served this share of every prompt (their runs cached an unpublished share; the "
                         "headline is without). Never use it to choose a constant")
    args = ap.parse_args(argv)
    if not (args.aiconfigurator or args.sim_to_real):
        ap.error("give --aiconfigurator DIR and/or --sim-to-real DIR")
    try:                                                 # refuse a bad what-if before reading anything
        what_if_answer_spread([], args.what_if_answer_spread) if args.what_if_answer_spread is not None else None
        what_if_prefix_reuse([], args.what_if_prefix_hit_rate) if args.what_if_prefix_hit_rate is not None else None
    except Exception as exc:                             # noqa: BLE001 — BadInput: the message says what is wrong
        ap.error(str(exc))

    workloads, skipped, sources = [], [], []
    golden, s2r_engine = None, {}
    if args.aiconfigurator:
        k, s, src = load_aiconfigurator(Repo(args.aiconfigurator))
        if args.aiconfigurator_predictions:
            with open(args.aiconfigurator_predictions, newline="") as f:
                n = attach_aiconfigurator_predictions(k, csv.DictReader(f))
            src.append(f"{args.aiconfigurator_predictions} (AIConfigurator's predictions, {n} rows matched)")
        if args.what_if_answer_spread is not None:
            k = what_if_answer_spread(k, args.what_if_answer_spread)
            src.append(f"WHAT-IF: AIConfigurator's answers' lengths spread by {args.what_if_answer_spread:g} "
                       "(they were identical; a sensitivity, not a result)")
        workloads += k; skipped += s; sources += src
    if args.sim_to_real:
        blis = Repo(args.inference_sim) if args.inference_sim else None
        golden = read_golden(blis) if blis else None
        k, s, src, s2r_engine = load_sim_to_real(Repo(args.sim_to_real), blis, args.with_cluster_run, golden)
        if args.what_if_prefix_hit_rate is not None:
            k = what_if_prefix_reuse(k, args.what_if_prefix_hit_rate)
            src.append(f"WHAT-IF: sim-to-real predicted at a prefix-cache hit rate of "
                       f"{args.what_if_prefix_hit_rate:g} (not published; a sensitivity, not a result)")
        workloads += k; skipped += s; sources += src
    print(f"{len(workloads)} workloads in scope, {len(skipped)} rows skipped; by set and GPU: "
          f"{json.dumps(coverage(workloads))}", file=sys.stderr)
    if args.list:
        for w in workloads:
            print(w["set"], w["id"], w["model"], w["gpu"], f"tp{w['tp']}", w["dtype"], json.dumps(w["load"]),
                  ",".join(sorted(w["measured"])))
        return 0

    api = importlib.import_module(args.predictor)
    kv = kv_cache_checks(golden[0], s2r_engine, api) if golden else []
    prompt_compute = implied_prompt_compute(workloads, api)
    rows, pskipped = evaluate(workloads, api, args.max_requests, args.limit, log=lambda s: print(s, file=sys.stderr))
    skipped += pskipped
    summary = summarise(rows)
    when = time.strftime("%Y-%m-%d")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(
        {"date": when, "sources": sources, "predictor": args.predictor, "coverage": coverage(workloads),
         "summary": summary, "kv_cache": kv, "implied_prompt_compute": prompt_compute, "rows": rows,
         "skipped": skipped}, indent=1))
    md = markdown(rows, skipped, summary, sources, when)
    (out / "results.md").write_text(md)
    print(md.split("## Every scored point")[0])
    if kv:
        print(f"KV cache: the memory arithmetic against {len(kv)} logged sizes of the sim-to-real deployments "
              f"({BLIS_GOLDEN}): median |error| {100 * statistics.median(abs(k['error']) for k in kv):.1f} %, "
              f"worst {100 * max(abs(k['error']) for k in kv):.1f} %")
        for k in kv:
            print(f"  {k['id']}: {k['model']} TP{k['tp']} on {k['gpu']}: {k['predicted_tokens']:,} predicted, "
                  f"{k['logged_tokens']:,} logged ({100 * k['error']:+.1f} %)")
    if prompt_compute:
        over = sorted((p for p in prompt_compute if p["share_of_peak"] > PREFILL_SHARE_CEILING),
                      key=lambda p: -p["share_of_peak"])
        print(f"Prompt compute: {len(over)} of {len(prompt_compute)} AIConfigurator closed loops would need more than "
              f"{PREFILL_SHARE_CEILING:.0%} of their GPUs' dense peak for their prompts alone (measured rate × ISL × "
              "2 FLOPs an active weight): prompts not all computed")
        for p in over:
            print(f"  {p['id']}: {p['model']} TP{p['tp']} {p['dtype']} on {p['gpu']}, {p['input_tokens']}/"
                  f"{p['output_tokens']} at {p['concurrency']}: {p['share_of_peak']:.0%}")
    print(f"wrote {out / 'results.json'} and {out / 'results.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
