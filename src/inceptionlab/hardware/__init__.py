"""What this machine is and what is fast on it: the one place that decides speed settings.

A speed setting (precision, memory format, torch.compile, threads) is never copied from another
machine. It is decided in two stages:

1. a capability probe that costs nothing rules candidates out: a CPU without bf16 units (oneDNN's own
   check) never runs bf16 under `auto`; a GPU's compute capability or gfx architecture says which
   precisions it has units for (the tables in `facts`, each row with its source);
2. a short calibration on the real model, input size, batch and device times the remaining candidates
   (warm-up excluded, bounded in time) and keeps one only if it beats the safe configuration (fp32,
   NCHW, eager) by a clear margin.

Measurements are cached on disk per device, capability, torch version, model, input shape, batch and
thread count (`SpeedCache`), so a second run decides instantly; `doctor --calibrate` measures afresh.
An explicit setting always wins: only the `auto` dimensions are searched.

Why not a fixed fast path: bf16 autocast was 4x fp32 on an Intel Xeon with AMX, 1.8x on an AMD EPYC
Zen 4 (AVX-512 bf16) and 10-30x *slower* on an AMD EPYC Zen 3 (AVX2 only, bf16 emulated), Inception
v3 training at 80 px (2026-11-24). GPUs spread the same way (sources in the tables).

The modules, each importable on its own (none imports torch at import time: the CLI sets MIOpen's
environment from here before torch loads):

- `facts`: `DeviceFacts` and the GPU fact tables (what an architecture has units for);
- `probe`: what this CPU or GPU is (asked of torch and oneDNN), and the emulation warning;
- `candidates`: `Candidate`, `Wanted` and which candidates the probe leaves for `auto`;
- `cache`: the on-disk speed cache and its key;
- `calibration`: timing the candidates within a budget and the `Decision`;
- `serving`: serving plans (instances x max batch) and their decision;
- `threads`: usable CPUs and the thread governor;
- `backends`: cuDNN's autotuner and TF32, one setting per device and precision, for every command;
- `miopen`: MIOpen's cache folders, set before torch is imported.
"""

from inceptionlab.hardware.backends import GpuSettings, apply_gpu_settings, cudnn_benchmark, gpu_settings, settings_for
from inceptionlab.hardware.cache import CacheKey, SpeedCache, cache_root, make_key
from inceptionlab.hardware.calibration import (
    CALIBRATION_BUDGET_S,
    CLEAR_MARGIN,
    GPU_CALIBRATION_BUDGET_S,
    MAX_TIMED_STEPS,
    MIN_TIMED_STEPS,
    Decision,
    Measure,
    calibration_budget,
    decide,
    free_device_memory,
    gflop_per_sample,
    measured_figures,
    pick,
    replace_choice,
    time_steps,
)
from inceptionlab.hardware.candidates import (
    AUTO,
    AUTO_ENV,
    SAFE,
    Candidate,
    Wanted,
    auto_is_safe,
    baseline_of,
    compile_dynamic_batch,
    compile_options,
    layout_options,
    plan_candidates,
    precision_options,
)
from inceptionlab.hardware.facts import (
    AMD_BF16_PREFIXES,
    AMD_FP16_SLOW_PREFIXES,
    AMD_NHWC_UNPROVEN_PREFIXES,
    NVIDIA_BF16_FROM,
    NVIDIA_FP16_FROM,
    NVIDIA_TF32_FROM,
    DeviceFacts,
    gpu_facts_from,
    no_bf16_reason,
)
from inceptionlab.hardware.miopen import MIOPEN_VARS, miopen_environment, prepare_process_environment, rocm_build_tag
from inceptionlab.hardware.probe import conv_slowdown, cpu_facts, device_facts, emulation_warning, gpu_facts
from inceptionlab.hardware.serving import (
    AUTO_MAX_BATCH,
    DEFAULT_SLO_MS,
    DELAY_SHARE,
    LIGHT_LOAD,
    MAX_AUTO_INSTANCES,
    SERVE_BUDGET_S,
    SLO_RATE_MARGIN,
    SLOW_MODEL_SLO_FACTOR,
    HostWork,
    Machine,
    PlanLatency,
    PlanModel,
    ServeDecision,
    ServePlan,
    batch_times,
    decide_serving,
    instance_threads,
    measured_plans,
    objective_and_latency,
    pick_plan,
    plan_delays,
    plan_model,
    serve_plans,
    simulate_plans,
)
from inceptionlab.hardware.threads import (
    CpuSample,
    ThreadGovernor,
    cgroup_cpu_quota,
    cpu_sample,
    others_cpu_seconds,
    others_cpus,
    thread_limit,
    usable_cpus,
)

__all__ = [
    "AMD_BF16_PREFIXES", "AMD_FP16_SLOW_PREFIXES", "AMD_NHWC_UNPROVEN_PREFIXES", "AUTO", "AUTO_ENV", "AUTO_MAX_BATCH",
    "CALIBRATION_BUDGET_S", "CLEAR_MARGIN", "DEFAULT_SLO_MS", "DELAY_SHARE", "GPU_CALIBRATION_BUDGET_S", "LIGHT_LOAD", "MAX_AUTO_INSTANCES", "MAX_TIMED_STEPS",
    "MIN_TIMED_STEPS", "MIOPEN_VARS", "NVIDIA_BF16_FROM", "NVIDIA_FP16_FROM", "NVIDIA_TF32_FROM", "SAFE",
    "SERVE_BUDGET_S", "SLO_RATE_MARGIN", "SLOW_MODEL_SLO_FACTOR", "CacheKey", "Candidate", "CpuSample", "Decision", "DeviceFacts",
    "GpuSettings", "HostWork", "Machine", "Measure", "PlanLatency", "PlanModel", "ServeDecision", "ServePlan", "SpeedCache", "ThreadGovernor", "Wanted",
    "apply_gpu_settings", "auto_is_safe", "baseline_of", "batch_times", "cache_root",
    "calibration_budget", "cgroup_cpu_quota", "compile_dynamic_batch", "compile_options", "conv_slowdown", "cpu_facts", "cpu_sample",
    "cudnn_benchmark", "decide", "decide_serving", "device_facts", "emulation_warning", "free_device_memory",
    "gflop_per_sample", "gpu_facts", "gpu_facts_from", "gpu_settings", "instance_threads", "layout_options",
    "make_key", "measured_figures", "measured_plans", "miopen_environment", "no_bf16_reason", "others_cpu_seconds",
    "objective_and_latency", "others_cpus", "pick", "pick_plan",
    "plan_candidates", "plan_delays", "plan_model", "precision_options", "prepare_process_environment", "replace_choice",
    "rocm_build_tag", "serve_plans", "settings_for", "simulate_plans", "thread_limit", "time_steps", "usable_cpus",
]
