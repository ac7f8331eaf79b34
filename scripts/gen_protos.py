"""Regenerate popmq/pb from protos/ with grpc_tools.protoc.

Each .proto under protos/ sits at the path of the Python module it becomes
(protos/popmq/pb/rocketmq/v2/service.proto -> popmq/pb/rocketmq/v2/service_pb2.py), so the
generated imports name our own package. The output is committed; tests/test_protos.py checks
that it matches what this script produces.

Every generated module registers its descriptors in popmq's own DescriptorPool
(popmq/pb/pool.py, also written here), never in protobuf's default pool: the official
rocketmq-python-client registers the same `apache.rocketmq.v2` symbols in the default pool, and
one process must be able to import both. protoc has no option for that, so after it runs the
`_descriptor_pool.Default()` call in each *_pb2.py is rewritten to `popmq.pb.pool.POOL`.
Well-known types (Timestamp, Duration) referenced by our protos are copied into that pool too;
use `popmq.pb.pool.Timestamp` / `Duration` with our messages, not google.protobuf's classes.

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
    _write_pool_module(out_dir, _well_known_imports(sources))
    for module in (out_dir / GENERATED_PACKAGE).rglob("*_pb2.py"):
        _use_private_pool(module)
    return generated_files(out_dir)


DEFAULT_POOL_CALL = "_descriptor_pool.Default().AddSerializedFile("
PRIVATE_POOL_IMPORT = "from popmq.pb import pool as _popmq_pool\n"


def _use_private_pool(module: Path) -> None:
    """Register the module's file in popmq's pool instead of the default one."""
    text = module.read_text()
    if text.count(DEFAULT_POOL_CALL) != 1:
        raise SystemExit(f"{module}: expected one {DEFAULT_POOL_CALL!r}; protoc output changed")
    marker = "# @@protoc_insertion_point(imports)\n"
    if marker not in text:
        raise SystemExit(f"{module}: no imports insertion point; protoc output changed")
    text = text.replace(DEFAULT_POOL_CALL, "_popmq_pool.POOL.AddSerializedFile(")
    text = text.replace(marker, PRIVATE_POOL_IMPORT + marker, 1)
    module.write_text(text)


def _well_known_imports(sources: list[Path]) -> list[str]:
    """google/protobuf/*.proto files our protos import (they must be in our pool first)."""
    found: set[str] = set()
    for source in sources:
        for line in (PROTO_ROOT / source).read_text().splitlines():
            line = line.strip()
            if line.startswith('import "google/protobuf/'):
                found.add(line.split('"')[1])
    return sorted(found)


POOL_MODULE = '''"""popmq's private DescriptorPool (written by gen_protos.py: do not edit).

Our apache.rocketmq.v2 types live here, not in protobuf's default pool, so that popmq imports
in a process that also uses the official rocketmq-python-client (which registers the same
symbols in the default pool). Messages of this pool take this pool's well-known types: build
Timestamp and Duration values with the classes below, not google.protobuf's.
"""

from typing import TYPE_CHECKING

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
{wkt_imports}

POOL = descriptor_pool.DescriptorPool()

for _module in ({wkt_modules}):
    _file = descriptor_pb2.FileDescriptorProto()
    _module.DESCRIPTOR.CopyToProto(_file)
    POOL.Add(_file)


def message_class(full_name: str) -> type:
    """The message class of a type in this pool (e.g. "google.protobuf.Timestamp")."""
    return message_factory.GetMessageClass(POOL.FindMessageTypeByName(full_name))


if TYPE_CHECKING:  # for type checkers: the same fields and methods as google.protobuf's
{wkt_typing}
else:
{wkt_classes}
'''


def _write_pool_module(out_dir: Path, well_known: list[str]) -> None:
    stems = [Path(name).stem for name in well_known]
    modules = [f"{stem}_pb2" for stem in stems]
    classes = {
        "duration": "Duration",
        "timestamp": "Timestamp",
        "empty": "Empty",
        "any": "Any",
        "struct": "Struct",
        "wrappers": None,
        "field_mask": "FieldMask",
    }
    text = POOL_MODULE.format(
        wkt_imports="".join(f"from google.protobuf import {m}\n" for m in modules).rstrip(),
        wkt_modules=", ".join(modules) + ",",
        wkt_typing="".join(
            f"    from google.protobuf.{stem}_pb2 import {classes[stem]} as {classes[stem]}\n"
            for stem in stems
            if classes.get(stem)
        ).rstrip(),
        wkt_classes="".join(
            f'    {classes[stem]} = message_class("google.protobuf.{classes[stem]}")\n'
            for stem in stems
            if classes.get(stem)
        ).rstrip(),
    )
    path = out_dir / GENERATED_PACKAGE / "pool.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


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
