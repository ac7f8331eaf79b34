"""Package layout only; every other setting is in pyproject.toml.

The repository keeps the design card's top-level folders (broker/, proxy/), but they install as
subpackages of the one `popmq` namespace: broker/ is `popmq.broker`, proxy/ is `popmq.proxy`.
Nothing else lands at the top level of site-packages except `pyspark_popmq`, the module name
PySpark scans to auto-register format("popmq").
"""

from setuptools import find_packages, setup

MAPPED = {"popmq.broker": "broker", "popmq.proxy": "proxy"}


def mapped(prefix: str, folder: str) -> list[str]:
    return [prefix, *(f"{prefix}.{name}" for name in find_packages(folder))]


packages = find_packages(include=["popmq", "popmq.*", "pyspark_popmq", "pyspark_popmq.*"])
for prefix, folder in MAPPED.items():
    packages += mapped(prefix, folder)
# The console's templates and assets: data folders, listed so setuptools ships them as such.
packages += ["popmq.console.templates", "popmq.console.static"]

setup(
    packages=packages,
    package_dir=MAPPED,
    package_data={
        "popmq": ["py.typed"],
        "popmq.pb": ["**/*.pyi"],
        "popmq.console.templates": ["*.html"],
        "popmq.console.static": ["*.css", "*.js"],
    },
)
