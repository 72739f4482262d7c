"""Package a level-4 model for LMI: serving.properties, the model folder, model.tar.gz.

LMI (DJL Serving) reads ``serving.properties`` from the model folder, imports the handler named
by ``option.entryPoint`` and gives it the ``option.*`` values. SageMaker unpacks
``ModelDataUrl`` (a tar.gz) into /opt/ml/model, so the files sit at the archive's root:

    model.tar.gz
      serving.properties   engine=Python, option.entryPoint=model.py, batching, dtype, ...
      model.py             the handler (options/custom_code/model.py)
      config.json, tokenizer files, *.safetensors   the weights (when not fetched by model_id)

The djl_python stand-in is not packaged: inside LMI the real djl_python is imported.
"""
from __future__ import annotations

import gzip
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from options.core import BadInput, is_secret_name

HANDLER_FILE = "model.py"
SERVING_PROPERTIES = "serving.properties"
TARBALL_NAME = "model.tar.gz"
# A fixed timestamp for every archive entry and the gzip header, so equal inputs give equal bytes.
ARCHIVE_MTIME = 0

# serving.properties keys that are DJL frontend settings, not "option." ones.
FRONTEND_KEYS = ("engine", "batch_size", "max_batch_delay", "max_idle_time", "job_queue_size",
                 "minWorkers", "maxWorkers", "load_on_devices")
DEFAULTS = {
    "engine": "Python",
    "option.entryPoint": HANDLER_FILE,
    "option.dtype": "fp16",
    # The handler batches for itself (dynamic batching below): no rolling batch engine.
    "option.rolling_batch": "disable",
    "batch_size": "4",
    "max_batch_delay": "100",
}
DTYPES = ("auto", "fp32", "fp16", "bf16", "float32", "float16", "bfloat16")
# Files in a model folder that the package writes itself rather than copies.
_OWN_FILES = {HANDLER_FILE, SERVING_PROPERTIES}


def handler_path() -> Path:
    """The handler that is packaged: options/custom_code/model.py."""
    return Path(__file__).with_name(HANDLER_FILE)


def property_key(name: str) -> str:
    """``OPTION_MAX_NEW_TOKENS``, ``option.max_new_tokens`` and ``max_new_tokens`` all name
    ``option.max_new_tokens``; frontend keys (``batch_size``, ...) stay bare."""
    if name.startswith("OPTION_"):
        rest = name[len("OPTION_"):].lower()
        return "option.entryPoint" if rest == "entrypoint" else f"option.{rest}"
    if name.startswith("option.") or name in FRONTEND_KEYS:
        return name
    if name.upper() == "ENTRYPOINT":
        return "option.entryPoint"
    return f"option.{name}"


def resolve_properties(properties: dict[str, str]) -> dict[str, str]:
    """The defaults overlaid with ``properties`` (any spelling), validated."""
    resolved = dict(DEFAULTS)
    for name, value in properties.items():
        key = property_key(name)
        if is_secret_name(key):
            raise BadInput(f"{name} looks like a secret: serving.properties ends up in "
                           f"model.tar.gz on S3, so secrets don't belong there; give it to the "
                           f"model as an environment variable instead (e.g. HF_TOKEN)")
        resolved[key] = str(value)
    _validate(resolved)
    return resolved


def _validate(props: dict[str, str]) -> None:
    entry = props["option.entryPoint"]
    if not entry.endswith(".py") or "/" in entry:
        raise BadInput(f"option.entryPoint={entry!r} must name a .py file in the model folder "
                       f"(e.g. option.entryPoint={HANDLER_FILE})")
    if props["engine"] != "Python":
        raise BadInput(f"engine={props['engine']!r}: a model.py handler runs on DJL's Python "
                       f"engine; use engine=Python")
    dtype = props["option.dtype"]
    if dtype not in DTYPES:
        raise BadInput(f"option.dtype={dtype!r} is not one of {', '.join(DTYPES)}")
    for key, least in (("batch_size", 1), ("max_batch_delay", 0),
                       ("option.max_batch_size", 1), ("option.max_new_tokens", 1)):
        if key not in props:
            continue
        value = props[key]
        if not value.isdigit() or int(value) < least:
            raise BadInput(f"{key}={value!r} must be a whole number of at least {least} "
                           f"(e.g. {key}={DEFAULTS.get(key, least)})")


def serving_properties(properties: dict[str, str]) -> str:
    """The text of serving.properties: frontend keys first, then options, each sorted."""
    resolved = resolve_properties(properties)
    frontend = sorted((k, v) for k, v in resolved.items() if not k.startswith("option."))
    options = sorted((k, v) for k, v in resolved.items() if k.startswith("option."))
    lines = ["# Written by Spectrum (level 4: bring your own code on LMI)."]
    lines += [f"{k}={v}" for k, v in frontend + options]
    return "\n".join(lines) + "\n"


def _is_model_folder(path: Path) -> bool:
    return (path / "config.json").is_file()


def prepare_model_dir(dest: Path, model_source: Path | None, properties: dict[str, str]) -> Path:
    """Lay out the folder LMI loads: the weights from ``model_source`` (hard links where the
    file system allows, else copies), ``model.py`` and ``serving.properties``.

    With ``model_source`` None the container fetches the model itself: ``properties`` must
    then name it (``model_id``, a hub id or an s3:// URI). ``dest`` must not exist or be
    empty; on any failure nothing is left behind.
    """
    dest = Path(dest)
    props = dict(properties)
    if model_source is None:
        if not any(property_key(k) == "option.model_id" for k in props):
            raise BadInput("no model: give a local model folder, or option.model_id "
                           "(a hub id or an s3:// URI) for the container to fetch")
    else:
        model_source = Path(model_source)
        if not _is_model_folder(model_source):
            raise BadInput(f"{model_source} is not a Hugging Face model folder (it has no "
                           f"config.json); give the folder that holds config.json, the "
                           f"tokenizer and the weights")
        # The weights travel in the archive: the handler loads them from model_dir.
        props = {k: v for k, v in props.items() if property_key(k) != "option.model_id"}
    text = serving_properties(props)   # validates before anything is written
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BadInput(f"{dest} already exists and is not an empty folder; choose a new one")

    dest.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        if model_source is not None:
            _link_or_copy_tree(model_source, building)
        shutil.copyfile(handler_path(), building / HANDLER_FILE)
        (building / SERVING_PROPERTIES).write_text(text, encoding="utf-8")
        if dest.exists():
            dest.rmdir()
        building.rename(dest)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return dest


def _link_or_copy_tree(source: Path, dest: Path) -> None:
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source)
        if any(part.startswith(".") for part in relative.parts) or relative.name in _OWN_FILES \
                or relative.suffix == ".lock":
            continue           # caches, lock files, and the files this package writes
        target = dest / relative
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        real = path.resolve()  # hub caches hold symlinks into a blob store
        try:
            os.link(real, target)
        except OSError:        # another file system, or links not allowed: copy
            shutil.copyfile(real, target)


def _archive_entry(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime = ARCHIVE_MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o755 if info.isdir() else 0o644
    return info


def build_model_tarball(model_dir: Path, dest: Path) -> Path:
    """``model.tar.gz`` with the folder's files at the archive root, as SageMaker unpacks it
    into /opt/ml/model. Deterministic: sorted entries, fixed times and owners, a gzip header
    without name or time, so the same folder gives the same bytes (and the same S3 ETag).

    ``dest`` is the archive's path (``*.tar.gz``), or a folder to write ``model.tar.gz`` into.
    """
    model_dir = Path(model_dir)
    if not (model_dir / HANDLER_FILE).is_file() and not (model_dir / SERVING_PROPERTIES).is_file():
        raise BadInput(f"{model_dir} has neither {HANDLER_FILE} nor {SERVING_PROPERTIES}: "
                       f"prepare it with prepare_model_dir() first")
    dest = Path(dest)
    if dest.is_dir() or not dest.name.endswith((".tar.gz", ".tgz")):
        dest = dest / TARBALL_NAME
    if dest.resolve().is_relative_to(model_dir.resolve()):
        raise BadInput(f"{dest} is inside {model_dir}: the archive would contain itself; "
                       f"write it somewhere else")
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".{dest.name}.partial")
    try:
        with open(partial, "wb") as raw, \
                gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=ARCHIVE_MTIME,
                              compresslevel=1) as zipped, \
                tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as archive:
            # Level 1: weights barely compress, and level 9 would cost minutes per GB.
            for path in sorted(model_dir.rglob("*")):
                relative = path.relative_to(model_dir).as_posix()
                if path.is_dir():
                    archive.addfile(_archive_entry(archive.gettarinfo(str(path), relative)))
                    continue
                real = path.resolve()
                info = _archive_entry(archive.gettarinfo(str(real), relative))
                info.type = tarfile.REGTYPE   # a symlink's target is stored as a plain file
                with open(real, "rb") as handle:
                    archive.addfile(info, handle)
        partial.replace(dest)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return dest
