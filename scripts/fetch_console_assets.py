"""Fetch the web console's vendored JavaScript (htmx, uPlot) from the npm registry.

Run it to refresh src/shoal/console/static/vendor/ and VENDORED.md after changing a pin below;
the fetched files are committed, so installing and testing shoal need no network and no Node
toolchain. Each tarball is checked against the registry's sha512 integrity string before
anything is written.

    python scripts/fetch_console_assets.py
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import sys
import tarfile
import urllib.request
from pathlib import Path

REGISTRY = "https://registry.npmjs.org"
STATIC = Path(__file__).resolve().parent.parent / "src" / "shoal" / "console" / "static"
VENDOR = STATIC / "vendor"

# (package, version, {file in the tarball: file under static/vendor/})
PINS: list[tuple[str, str, dict[str, str]]] = [
    # 2.x: htmx 4 (npm's "latest") is a rewrite whose attributes and events differ.
    ("htmx.org", "2.0.8", {"package/dist/htmx.min.js": "htmx.min.js",
                           "package/LICENSE": "htmx.LICENSE"}),
    ("uplot", "1.6.32", {"package/dist/uPlot.iife.min.js": "uPlot.iife.min.js",
                         "package/dist/uPlot.min.css": "uPlot.min.css",
                         "package/LICENSE": "uPlot.LICENSE"}),
]


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as response:  # noqa: S310 - fixed https URL
        data: bytes = response.read()
        return data


def fetch(package: str, version: str, files: dict[str, str]) -> tuple[str, str, str]:
    meta = json.loads(_get(f"{REGISTRY}/{package}/{version}"))
    dist = meta["dist"]
    tarball = _get(dist["tarball"])
    algo, _, expected = dist["integrity"].partition("-")
    if algo != "sha512" or base64.b64encode(hashlib.sha512(tarball).digest()).decode() != expected:
        sys.exit(f"{package}@{version}: the tarball does not match the registry's integrity "
                 f"{dist['integrity']}; nothing written")
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
        for member, target in files.items():
            extracted = tar.extractfile(member)
            if extracted is None:
                sys.exit(f"{package}@{version}: {member} is not a file in its tarball")
            (VENDOR / target).write_bytes(extracted.read())
    return meta.get("license", "unknown"), dist["tarball"], dist["integrity"]


def main() -> None:
    VENDOR.mkdir(parents=True, exist_ok=True)
    rows = []
    for package, version, files in PINS:
        licence, url, integrity = fetch(package, version, files)
        rows.append(f"| {package} | {version} | {licence} | {', '.join(files.values())} | "
                    f"{url} | `{integrity}` |")
        print(f"fetched {package}@{version} ({licence})")  # noqa: T201 - a script
    (STATIC / "VENDORED.md").write_text(
        "# Vendored files of the web console\n\n"
        "Fetched from the npm registry by `scripts/fetch_console_assets.py` (edit its pins and "
        "rerun it to update); committed so that installing and testing need no network.\n\n"
        "| package | version | licence | files (in `vendor/`) | tarball | integrity |\n"
        "|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
