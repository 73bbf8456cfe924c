"""The memkv-vllm checks on a CUDA host, with vLLM's own CPU-pool worker (no scaffold).

Not collected by pytest (CI has no GPU). Run on a GPU host with vLLM, torch and
transformers importable and memkv-client / memkv-vllm on PYTHONPATH (their entry point
registered through a dist-info, see README): `python memkv_gpu_check.py OUTDIR`
(`run_memkv_gpu_check.sh` does all of it). Writes `OUTDIR/gpu_check.json` and exits non-zero if a check fails.

Checks: identical tokens with the tier (`TieringOffloadingSpec`, vLLM's CUDA worker for
the CPU pool); a second engine process hits through MemKV; a MemKV restart between lookup
and load recomputes; the direct spec round-trips from CUDA KV tensors, in and across
processes.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests-integration"), str(ROOT / "tools")]

import tiny_model  # noqa: E402
from engine_process import BLOCK, Engine  # noqa: E402
from memkv_harness import P1, PROMPTS, direct_config, start_engine, tier_config  # noqa: E402
from memkv_server import MemKVServer  # noqa: E402
from vllm_env import EngineRun  # noqa: E402


def gpu_tier_config() -> dict[str, Any]:
    cfg = tier_config()
    extra = cfg["kv_connector_extra_config"]
    extra["spec_name"] = "TieringOffloadingSpec"  # the real one: vLLM's CUDA CPU-pool worker
    del extra["spec_module_path"]
    return cfg


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    model = str(tiny_model.build(out / "tiny-llama", "llama"))
    memkv = MemKVServer(out / "memkv.log").start()
    counter = iter(range(100))
    checks: dict[str, Any] = {}

    def engine(spec: dict[str, Any]) -> Engine:
        folder = out / f"engine{next(counter)}"
        folder.mkdir()
        return start_engine({"model": model, **spec}, folder, **memkv.env())

    def check(name: str, ok: bool, detail: Any) -> None:
        checks[name] = {"ok": bool(ok), "detail": detail}
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)

    start = time.monotonic()
    try:
        base = engine({"phases": [{"prompts": PROMPTS}]}).result()
        tier = {"kv_transfer_config": gpu_tier_config(), "phases": [{"prompts": PROMPTS}]}
        first = engine(tier).result()
        check("tier: same tokens", first.tokens(0) == base.tokens(0), first.cached(0))
        second = engine(tier).result()
        check(
            "tier: second process hits through MemKV",
            second.tokens(0) == base.tokens(0) and second.cached(0)[0] == 6 * BLOCK,
            second.cached(0),
        )
        restart = engine(
            {
                "kv_transfer_config": gpu_tier_config(),
                "phases": [
                    {"prompts": [P1]},
                    {"pause": True, "reset_connector": True, "prompts": [P1]},
                ],
            }
        )
        restart.wait_paused(1)
        memkv.restart()
        restart.resume(1)
        run: EngineRun = restart.result()
        check(
            "tier: MemKV restart between lookup and load recomputes",
            run.tokens(1) == [base.tokens(0)[0]]
            and run.cached(1) == [0]
            and "could not be loaded" in run.log,
            run.cached(1),
        )
        direct = {
            "kv_transfer_config": direct_config(),
            "phases": [
                {"prompts": PROMPTS},
                {"reset_prefix_cache": True, "prompts": PROMPTS},
            ],
        }
        d1 = engine(direct).result()
        check(
            "direct: round trip from CUDA KV",
            d1.tokens(1) == base.tokens(0) and d1.cached(1)[0] == 6 * BLOCK,
            d1.cached(1),
        )
        d2 = engine({**direct, "phases": direct["phases"][:1]}).result()
        check(
            "direct: second process hits",
            d2.tokens(0) == base.tokens(0) and d2.cached(0)[0] == 6 * BLOCK,
            d2.cached(0),
        )
    except BaseException as exc:  # report what ran, then fail
        checks["error"] = {"ok": False, "detail": "".join(traceback.format_exception(exc))[-4000:]}
        print(checks["error"]["detail"], flush=True)
    finally:
        memkv.stop()
    checks["seconds"] = round(time.monotonic() - start, 1)
    (out / "gpu_check.json").write_text(json.dumps(checks, indent=2))
    return 0 if all(v["ok"] for k, v in checks.items() if k != "seconds") else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
