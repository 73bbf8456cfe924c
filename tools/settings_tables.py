"""Write (or check) each README's configuration table from the settings' declarations.

`python tools/settings_tables.py` rewrites the table between the markers

    <!-- settings-table: NAME -->
    ...
    <!-- /settings-table -->

in every README listed in TABLES; `--check` changes nothing and exits 1 (naming the
README) if a table differs from the declarations.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _kvpool_mmap() -> str:
    from kvpool_mmap import markdown_table, store_settings

    return markdown_table(store_settings())


def _vllm_marconi_offload() -> str:
    from kvpool_mmap import markdown_table
    from vllm_marconi_offload.config import SETTINGS

    return markdown_table(SETTINGS, header="Key")


def _memkv_vllm(name: str) -> Callable[[], str]:
    def table() -> str:
        from kv_offload_settings import markdown_table
        from memkv_vllm.config import SETTINGS_TABLES

        return markdown_table(SETTINGS_TABLES[name], header="Key")

    return table


def _memkv_vllm_store() -> str:
    from kv_offload_settings import markdown_table
    from memkv_vllm.store import store_settings

    return markdown_table(store_settings(), header="Key")


def _memkv_client() -> str:
    from kv_offload_settings import markdown_table
    from memkv_client.config import SETTINGS

    return markdown_table(SETTINGS)


def _memkv_client_environment() -> str:
    from kv_offload_settings import markdown_table
    from memkv_client.environment import ENVIRONMENT

    return markdown_table(ENVIRONMENT, header="Variable")


MEMKV_VLLM_README = ROOT / "packages/memkv-vllm/README.md"
TABLES: dict[str, tuple[Path, Callable[[], str]]] = {
    "kvpool-mmap": (ROOT / "packages/kvpool-mmap/README.md", _kvpool_mmap),
    "vllm-marconi-offload": (
        ROOT / "packages/vllm-marconi-offload/README.md",
        _vllm_marconi_offload,
    ),
    "memkv-client": (ROOT / "packages/memkv-client/README.md", _memkv_client),
    "memkv-client-environment": (
        ROOT / "packages/memkv-client/README.md",
        _memkv_client_environment,
    ),
    "memkv-vllm-tier": (MEMKV_VLLM_README, _memkv_vllm("memkv-vllm-tier")),
    "memkv-vllm-direct": (MEMKV_VLLM_README, _memkv_vllm("memkv-vllm-direct")),
    "memkv-vllm-store": (MEMKV_VLLM_README, _memkv_vllm_store),
}


def _block(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- settings-table: {re.escape(name)} -->\n)(.*?)(<!-- /settings-table -->)",
        re.DOTALL,
    )


def render(name: str, text: str) -> str:
    """`text` (a README) with table `name` rewritten; ValueError if it has no markers."""
    _, table = TABLES[name]
    pattern = _block(name)
    if not pattern.search(text):
        raise ValueError(f"no '<!-- settings-table: {name} -->' ... markers")
    return pattern.sub(lambda m: m[1] + table() + "\n" + m[3], text, count=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report tables that differ")
    parser.add_argument("names", nargs="*", default=sorted(TABLES), help="tables (default: all)")
    args = parser.parse_args(argv)
    status = 0
    for name in args.names:
        readme, _ = TABLES[name]
        text = readme.read_text()
        try:
            wanted = render(name, text)
        except ValueError as exc:
            print(f"{readme.relative_to(ROOT)}: {exc}", file=sys.stderr)
            status = 1
            continue
        if wanted == text:
            continue
        if args.check:
            print(
                f"{readme.relative_to(ROOT)}: the settings table differs from the declarations; "
                "run python tools/settings_tables.py",
                file=sys.stderr,
            )
            status = 1
        else:
            readme.write_text(wanted)
            print(f"rewrote the settings table of {readme.relative_to(ROOT)}")
    return status


if __name__ == "__main__":
    sys.exit(main())
