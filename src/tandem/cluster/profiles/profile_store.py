"""Where profiles live and which one a worker uses.

`tandem profile` saves to
`$TANDEM_HOME/profiles/devices/<model>__<backend>__<device>__<dtype>__<threads>t.json` unless
told otherwise (a model given as a path: its name and a digest of its absolute path). For a
worker running a model, `worker_profile` looks, in order, at:

1. `profiles:` in the cluster file under the worker's name, then under its hardware class
   (a file, or a list of files of which the one for this model is taken);
2. a public-spec profile, when the worker names a known hardware class (public_profiles.py);
3. the default path above, for the worker's (model, backend, device, dtype, threads);

and otherwise says which `tandem profile` command would make one.
"""

import functools
import hashlib
import os
import re
import sys
from pathlib import Path

from tandem.cluster.config.cluster_spec import ClusterSpec, WorkerSpec
from tandem.cluster.config.load import located_error
from tandem.cluster.profiles.profile import DeviceProfile, load_profile
from tandem.cluster.profiles.public_profiles import DEVICE_CLASSES, public_profile
from tandem.errors import TandemError, did_you_mean
from tandem.models.catalog import CATALOG
from tandem.paths import profiles_dir
from tandem.models.backends import precision_of


def default_profile_path(model: str, backend: str, device: str, dtype: str, threads: int | None) -> Path:
    precision = precision_of(backend, dtype)
    count = threads or os.cpu_count() or 1
    parts = (_slug(model), backend, _slug(device), precision, f"{count}t")
    return profiles_dir() / "devices" / ("__".join(parts) + ".json")


def _slug(text: str) -> str:
    """A catalog name as it is; a file or folder by its name plus a digest of its absolute path,
    so that `/a/m.gguf` and `/b/m.gguf` never share a profile."""
    name = Path(text).name if os.sep in text else text
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "model"
    if os.sep not in text:
        return slug
    where = hashlib.sha256(os.path.abspath(os.path.expanduser(text)).encode()).hexdigest()[:8]
    return f"{slug}-{where}"


def worker_models(worker: WorkerSpec) -> tuple[str, ...]:
    """The models a worker may run: its target if it can verify, its draft model if it can draft."""
    models = [worker.model] if worker.can_verify else []
    if worker.drafting_model is not None:
        models.append(worker.drafting_model)
    return tuple(dict.fromkeys(models))


def worker_profile(spec: ClusterSpec, worker: WorkerSpec, model: str) -> DeviceProfile:
    for key in (worker.name, worker.hardware):
        if key is not None and key in spec.profiles:
            return _pick(spec.profiles[key], model, f"profiles.{key}")
    if worker.hardware in DEVICE_CLASSES:
        return public_profile(worker.hardware, model, worker.backend, _precision(worker), worker.device)
    path = default_profile_path(model, worker.backend, worker.device, worker.dtype, worker.threads)
    if path.exists():
        if worker.hardware is not None:  # a label of its own is fine, but one mistyped priced this machine silently
            _note_unknown_hardware(worker.name, worker.hardware, str(path))
        return load_profile(path)
    entry = next((i for i, w in enumerate(spec.workers) if w is worker), None)  # its place in the file's list
    if worker.hardware is not None and entry is not None:
        raise located_error(spec, ("workers", entry, "hardware"),
                            f"worker {worker.name!r}: hardware {worker.hardware!r} is neither a known device class "
                            f"({', '.join(DEVICE_CLASSES)}){did_you_mean(worker.hardware, DEVICE_CLASSES)} nor a "
                            f"profiles: key, and this machine has no profile measured for {model} on "
                            f"{worker.device} ({worker.backend}): run `tandem profile"
                            f"{' --cluster ' + spec.source if spec.source else ''}` where it runs")
    if model not in CATALOG and not os.path.exists(os.path.expanduser(model)):
        message = (f"worker {worker.name!r}: model {model!r} is neither a catalog model nor a file or folder "
                   f"here{did_you_mean(model, CATALOG)}")
        if entry is None:
            raise TandemError(message)
        raise located_error(spec, ("workers", entry, "model" if model == worker.model else "draft_model"), message)
    source = f" --cluster {spec.source}" if spec.source else ""
    raise TandemError(
        f"no profile for worker {worker.name!r} ({model} on {worker.device}, {worker.backend}): "
        f"run `tandem profile{source}` or `tandem profile --model {model} --backend {worker.backend} "
        f"--device {worker.device}" + (f" --threads {worker.threads}" if worker.threads else "")
        + "`, name a file under profiles:, or give the worker a known hardware class "
        f"({', '.join(DEVICE_CLASSES)})")


@functools.cache
def _note_unknown_hardware(worker: str, hardware: str, path: str) -> None:
    """Said once a process: profiles are read per replica and per size of a scaling sweep."""
    print(f"note: worker {worker!r}: hardware {hardware!r} is neither a known device class"
          f"{did_you_mean(hardware, DEVICE_CLASSES)} nor a profiles: key; it is priced on its measured "
          f"profile ({path})", file=sys.stderr)


def cluster_profiles(spec: ClusterSpec) -> dict[tuple[str, str], DeviceProfile]:
    """Every (worker name, model) the planner may price, with its profile."""
    return {(worker.name, model): worker_profile(spec, worker, model)
            for worker in spec.workers for model in worker_models(worker)}


def _precision(worker: WorkerSpec) -> str:
    return precision_of(worker.backend, worker.dtype)


def _pick(paths: tuple[str, ...], model: str, where: str) -> DeviceProfile:
    profiles = [load_profile(path) for path in paths]
    matching = [p for p in profiles if _same_model(p.model, model)]
    if matching:
        return matching[0]
    if len(profiles) == 1 and len(paths) == 1:
        raise TandemError(f"{where}: {paths[0]} profiles {profiles[0].model!r}, not {model!r}")
    raise TandemError(f"{where}: none of its {len(paths)} files profiles {model!r}")


def _same_model(a: str, b: str) -> bool:
    return a == b or _slug(a) == _slug(b)
