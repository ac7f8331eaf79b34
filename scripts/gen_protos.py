"""Regenerate popmq/pb from protos/ with grpc_tools.protoc.

Each .proto under protos/ sits at the path of the Python module it becomes
(protos/popmq/pb/rocketmq/v2/service.proto -> popmq/pb/rocketmq/v2/service_pb2.py), so the
generated imports name our own package. The output is committed; tests/test_protos.py checks
that it matches what this script produces.

Usage: python scripts/gen_protos.py [OUT_DIR]   (OUT_DIR defaults to the repository root)
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO_ROOT / "protos"
# Only this subtree is ours to generate; everything in it is replaced.
GENERATED_PACKAGE = Path("popmq/pb")


def proto_files(root: Path = PROTO_ROOT) -> list[Path]:
    return sorted(path.relative_to(root) for path in root.rglob("*.proto"))


def generate(out_dir: Path = REPO_ROOT) -> list[Path]:
    """Write the generated modules (and package __init__ files) under out_dir; return them."""
    out_dir = Path(out_dir)
    sources = proto_files()
    if not sources:
        raise SystemExit(f"no .proto files under {PROTO_ROOT}")
    # google/protobuf/*.proto (timestamp, duration) ship inside grpc_tools.
    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(source) for source in sources),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed (see the messages above)")
    _add_package_inits(out_dir, sources)
    return generated_files(out_dir)


def _add_package_inits(out_dir: Path, sources: list[Path]) -> None:
    """protoc writes modules, not packages: give every generated directory an __init__.py."""
    package_dirs = {GENERATED_PACKAGE}
    for source in sources:
        for parent in source.parents:
            if parent.is_relative_to(GENERATED_PACKAGE):
                package_dirs.add(parent)
    for package in sorted(package_dirs):
        init = out_dir / package / "__init__.py"
        if not init.exists():
            init.parent.mkdir(parents=True, exist_ok=True)
            init.write_text("")


def generated_files(root: Path) -> list[Path]:
    """Every file this script owns under root (what the freshness test compares)."""
    base = Path(root) / GENERATED_PACKAGE
    return sorted(
        path
        for path in base.rglob("*")
        if path.is_file() and path.suffix in (".py", ".pyi") and "__pycache__" not in path.parts
    )


def main(argv: list[str]) -> int:
    out_dir = Path(argv[1]) if len(argv) > 1 else REPO_ROOT
    for path in generate(out_dir):
        print(path.relative_to(out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
