"""minincl: a small, readable collective-communication runtime in the spirit of NCCL.

    import numpy as np, minincl
    comms = minincl.Communicator.init_all(4)        # four ranks in this process
    ...

See the README for the full tour.
"""

from . import errors
from ._c_library import get_cmake_dir, get_include, get_library_dir
from ._comm import (
    Communicator,
    LaunchError,
    Topology,
    Work,
    get_unique_id,
    gpu_count,
    group,
    init_from_env,
    launch,
    unique_id_for_address,
)
from ._core import PreMulSum, build_info
from ._core import version as _version
from .errors import Aborted, Error, InvalidArgument, InvalidUsage, RemoteError, SystemError, Timeout

__version__ = _version()

__all__ = [
    "Aborted",
    "Communicator",
    "Error",
    "InvalidArgument",
    "InvalidUsage",
    "LaunchError",
    "PreMulSum",
    "RemoteError",
    "SystemError",
    "Timeout",
    "Topology",
    "Work",
    "build_info",
    "errors",
    "get_cmake_dir",
    "get_include",
    "get_library_dir",
    "get_unique_id",
    "gpu_count",
    "group",
    "init_from_env",
    "launch",
    "unique_id_for_address",
]
