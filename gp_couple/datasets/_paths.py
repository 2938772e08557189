"""Data-directory resolution, the checksum registry and shared loader helpers.

gp_couple never bundles data. Every loader takes a ``data_dir`` argument and falls
back to the environment variable :data:`ENV_VAR` (``GP_COUPLE_DATA``); the directory
has the layout of the project's shared dataset snapshot (``traffic/``, ``meshes/``,
``graphs/``, ``uci/``; see ``datasets/README.md`` at the repository root).

Every file a loader reads has its SHA-256 digest in :data:`CHECKSUMS`, keyed by its
path relative to the data directory. Loaders verify it by default; a successful
verification is remembered for the rest of the process (keyed by the file's resolved
path, size and modification time), so repeated loads hash each file only once.
"""

from __future__ import annotations

import codecs
import hashlib
import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType

import numpy as np

from .._random import SeedLike, as_numpy_generator

PathLike = str | os.PathLike

#: Environment variable consulted when no ``data_dir`` is passed.
ENV_VAR = "GP_COUPLE_DATA"

_CHUNK_BYTES = 1 << 20

#: SHA-256 digests of every file a loader reads, keyed by the POSIX path relative to
#: the data directory. Computed from the shared dataset snapshot described in
#: ``datasets/README.md``.
CHECKSUMS: Mapping[str, str] = MappingProxyType({
    "traffic/pems_traffic.npz":
        "4d07840db6ff2bad92b098ba22af05738c7d0351bb8d7ef2608e9784367a1f44",
    "meshes/teapot.stl":
        "2c0c36eba0f33d0f10429e9f7e06bf34fa3df0bc9ee1082fd32eb89cd483e9b6",
    "meshes/fuze.obj":
        "a42779b57af5969baf8a08fd2194f57d5a87882ddc1f2dfcce05f99519e7ce60",
    "meshes/sphere.ply":
        "c9d4f8188871229e3c099f931b38a55c46ab40b46889a715765e082e6941009d",
    "meshes/idler_riser.STL":
        "8fb9237ab07cdd50b033ade13d79f14ba9ac68cefb0be07cb993a535a344b733",
    "meshes/featuretype.STL":
        "c9946c4bb8034cd43522526a2f325200e2d2322a0c7258f848a81f00e418dab3",
    "meshes/busted.STL":
        "ec9d11fd0db249f1e40b737d07227cfc2f06bbd033e3dcc9e785b5ec25b8d024",
    "meshes/fandisk.obj":
        "27e201141bf9c869b922ce4f03fdef7b5dfc62b7e721f77b44efae1e2aecdce9",
    "meshes/torus.STL":
        "91441a7f60479bda93c59dd88134da3b4f33d1df71729fe71e1b2ae989974da3",
    "meshes/bunny.ply":
        "8faa052bb08cf1625eec97b6508baceee11eec9cf28f83f6a9d4547ab15d7761",
    "meshes/cycloidal.ply":
        "d10f336ff4c4ca7f2c262b1fd880a2ac2bbe1ea60c072951f3f5003986481e5a",
    "graphs/karate/karate_edges.csv":
        "c61f72a1272d16e5091cac045ec40d4e9a08598964a6177fb64455417b0f6cb6",
    "graphs/dolphins/dolphins_edges.csv":
        "3701a547466666d78f9b816ff4ceac2e83611d2a57100ff4241b7cd8e4b4f36e",
    "graphs/football/football_edges.csv":
        "7a7c00f652ffd51b56fc2133505abf521967675ea74cdfd48bf24f8092a0f07c",
    "graphs/polbooks/polbooks_edges.csv":
        "3ab7761eaee641ab23b006340caa9cb71b1b319d2f019bab961419ce8b07e519",
    "graphs/netscience/netscience_edges.csv":
        "7f7b343b0eed82960cbc692da9ba38db6b1179ced7e7460002890d09d26c27ef",
    "graphs/eurosis/eurosis_edges.csv":
        "a816c0d7894902586e637081f3a685490c9f47e51759084be8647f6255ec9adf",
    "graphs/cora/cora_edges.csv":
        "3df63b0cac3057cd0edd2705e000834621ad260d46a19ffe51f8443c11d766c0",
    "graphs/citeseer/citeseer_edges.csv":
        "3852ea99524579499fad6b540f23ec78f3920810f8adebb3769ca32ac5489d9c",
    "graphs/pubmed/pubmed_edges.csv":
        "cd4df7a08b3ed61c3336befa4763fc149dc8d3b3d274bb62591a3fe58a137264",
    "graphs/ego_facebook/facebook_combined_edges.csv":
        "b0e026a45711ace0b9a49c07be4ac16f8a04097324b54b89cf626ea711dad63d",
    "graphs/email_enron/email-Enron_edges.csv":
        "ef95b1654300ac19ebed8a859fa236eee3db780a714881d1b0c3e5ccfbccadd7",
    "graphs/facebook_page_page/facebook_edges.csv":
        "4aa17ccac6b4b1453396c75ac5dd848dafc435dfa75343f9ad25162a35df94bc",
    "graphs/github_musae/github_edges.csv":
        "355dc8ca50ffdbe031e8be4f037955f17c543ed4c03460d261601338b520a36e",
    "graphs/internet_as_2006/as-22july06_edges.csv":
        "5dac2c54a72dccfbd59c7d7e9acec95be96890880596b8854321d2c7883fdff4",
    "graphs/california_roads/cal_edges.csv":
        "724992d77bce679d9a4cc99349f3ab3a3bcde2a1a55c417d5181fe1f3650390f",
    # Node files with class labels (read by gp_couple.datasets.load_node_labels).
    "graphs/karate/karate_nodes.csv":
        "a99d1c61aeaf79ce9e603e891c1665632a2da172af31d96e10d898df85c29183",
    "graphs/football/football_nodes.csv":
        "9200257dd933e3d5c85fbfcf4881d6c1fc66820cc9fb4d8b918858175c788ee2",
    "graphs/polbooks/polbooks_nodes.csv":
        "69e7ad6fca7d5d5e866a0993d71ba07a5d35b02033a578d44dc0fc927acd9dd0",
    "graphs/cora/cora_nodes.csv":
        "de79e54232acc37c9996eb5bb15274304fd38c389adf74647153b4ee6058709f",
    "graphs/citeseer/citeseer_nodes.csv":
        "7a17bb60a47ed30ca2bd3a4032224638321407f30bf2a1be0c2628b74e59c2a6",
    "graphs/pubmed/pubmed_nodes.csv":
        "f4deb12f26c0d16656a51ae0abcc39a9bc6a8877a58bef51515d57fac8719b1c",
    "uci/concrete/concrete.csv":
        "fad097d25db12e69b0eb7bd0c61b2d40ccb4ca2af5bafffc9bf3616b210f59a6",
    "uci/abalone/abalone_numeric.csv":
        "9697dbffa0323239277e27e6a5b4d67b6c132072ffdf6200165ce95c91c042dc",
    "uci/machine_cpu/machine_numeric.csv":
        "20ed679825a7de2a2807fe07505b52835ff87b0c687d0580724cb3767af0dc00",
    "uci/power_plant/power_plant.csv":
        "8536d099390b7f7a99c1c3befecd1556877994553619ea6d83aea657bc2da817",
    "uci/airfoil/airfoil.csv":
        "5ed7f15b48e56b29a268f7f1f9414b38be9917183e5f5d2d5f6fedcc9436faa7",
    "uci/boston_housing/boston_housing.csv":
        "6eb46e3763e23e85609fb319175fa05d6c82c66036c184f116730a5e52e53fed",
    "uci/energy/energy.csv":
        "574de2f9b9f4c33b064706068ac8a22d12c527a347cebf7f27afdcda58ddaadd",
    "uci/yacht/yacht.csv":
        "30d637df03e7ce59c68afe6920de623878cace3111d3727be352d70c1674ead7",
    "uci/kin8nm/kin8nm.csv":
        "9cb1ac23423d359a1e79b7059c21b2db746de80044ecf71cd8fa1131cb46da6b",
})

_verified: set[tuple[str, str, int, int]] = set()
_verified_lock = threading.Lock()


def resolve_data_dir(data_dir: PathLike | None = None) -> Path:
    """Return the data directory: ``data_dir`` if given, else ``$GP_COUPLE_DATA``.

    :param data_dir: Directory holding the datasets, or ``None`` to use the
        environment variable ``GP_COUPLE_DATA``.
    :return: The directory as an absolute :class:`~pathlib.Path` (``~`` expanded).
    :raises FileNotFoundError: If neither ``data_dir`` nor ``GP_COUPLE_DATA`` is given,
        or the directory does not exist.
    :raises NotADirectoryError: If the path exists but is not a directory.
    :raises TypeError: If ``data_dir`` is not a path.
    """
    if data_dir is None:
        from_env = os.environ.get(ENV_VAR, "").strip()
        if not from_env:
            raise FileNotFoundError(
                f"no data directory: pass data_dir=... or set the environment variable "
                f"{ENV_VAR} to the directory holding the datasets (layout: traffic/, "
                "meshes/, graphs/, uci/; see datasets/README.md)")
        path, source = Path(from_env), f"${ENV_VAR}"
    else:
        if not isinstance(data_dir, (str, os.PathLike)):
            raise TypeError(f"data_dir must be a path or None, got {type(data_dir).__name__}")
        path, source = Path(data_dir), "data_dir"
    path = path.expanduser().absolute()
    if not path.exists():
        raise FileNotFoundError(f"data directory {path} (from {source}) does not exist")
    if not path.is_dir():
        raise NotADirectoryError(f"data directory {path} (from {source}) is not a directory")
    return path


def sha256_file(path: PathLike) -> str:
    """Hex SHA-256 digest of a file, read in 1 MiB chunks.

    :param path: File to hash.
    :return: The 64-character lower-case hex digest.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_file(path: PathLike, relative_name: str) -> None:
    """Check ``path`` against the registered digest of ``relative_name``.

    A successful check is cached for the process, keyed by the resolved path, its size
    and its modification time, so a file that changes is checked again.

    :param path: The file on disk.
    :param relative_name: Its key in :data:`CHECKSUMS` (POSIX path relative to the data
        directory, e.g. ``"traffic/pems_traffic.npz"``).
    :raises KeyError: If ``relative_name`` is not in the registry.
    :raises FileNotFoundError: If ``path`` does not exist.
    :raises ValueError: If the digest differs; the message names the file and both digests.
    """
    if relative_name not in CHECKSUMS:
        raise KeyError(f"{relative_name!r} has no registered checksum; known files: "
                       f"{', '.join(sorted(CHECKSUMS))}")
    resolved = Path(path).resolve()
    stat = resolved.stat()
    key = (str(resolved), relative_name, stat.st_size, stat.st_mtime_ns)
    with _verified_lock:
        if key in _verified:
            return
    expected = CHECKSUMS[relative_name]
    actual = sha256_file(resolved)
    if actual != expected:
        raise ValueError(
            f"checksum mismatch for {relative_name} ({resolved}): expected SHA-256 "
            f"{expected}, got {actual}. The file is corrupt or a different version; "
            "restore it, or pass verify=False to load it anyway")
    with _verified_lock:
        _verified.add(key)


def clear_verification_cache() -> None:
    """Forget which files were verified, so the next load hashes them again."""
    with _verified_lock:
        _verified.clear()


def data_file(relative_name: str, data_dir: PathLike | None = None, verify: bool = True) -> Path:
    """Locate a registered file in the data directory, optionally verifying it.

    :param relative_name: POSIX path relative to the data directory (a key of
        :data:`CHECKSUMS`).
    :param data_dir: Data directory (default ``$GP_COUPLE_DATA``).
    :param verify: Check the file's SHA-256 digest (cached per process).
    :return: The file's absolute path.
    :raises FileNotFoundError: If the data directory or the file is missing.
    :raises ValueError: On a checksum mismatch.
    """
    root = resolve_data_dir(data_dir)
    path = root.joinpath(*relative_name.split("/"))
    if not path.is_file():
        raise FileNotFoundError(
            f"missing dataset file {relative_name}: looked for {path} in data directory {root}")
    if verify:
        verify_file(path, relative_name)
    return path


def looks_like_name(value: object) -> bool:
    """Whether ``value`` looks like a bare dataset name rather than a path.

    :param value: A loader's name-or-path argument.
    :return: ``True`` for a non-empty str with no path separator and no file suffix.
    """
    return (isinstance(value, str) and bool(value) and "/" not in value and os.sep not in value
            and not Path(value).suffix)


def existing_path(value: object, argument: str, kind: str, names: Iterable[str], *, expected: str,
                  missing: str) -> Path:
    """``value`` as an existing path, or the error a loader's name-or-path argument deserves.

    :param value: The loader's argument (names the caller knows are resolved before this).
    :param argument: The argument's name, for the ``TypeError``.
    :param kind: What the known names are (``"graph"``, ``"mesh"``).
    :param names: The known names, listed when ``value`` looks like a misspelt name.
    :param expected: What a path should be, e.g. ``"a path to a mesh file"``.
    :param missing: What a missing path is called, e.g. ``"mesh file"``.
    :raises TypeError: If ``value`` is neither a str nor a path.
    :raises ValueError: If it looks like a name but is not a known one.
    :raises FileNotFoundError: If the path does not exist.
    """
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{argument} must be a {kind} name or a path, got {type(value).__name__}")
    path = Path(value).expanduser()
    if not path.exists():
        if looks_like_name(value):
            raise ValueError(f"unknown {kind} {value!r}: expected one of {', '.join(names)} or {expected}")
        raise FileNotFoundError(f"{missing} {path.absolute()} does not exist")
    return path


#: Byte-order marks of the encodings a UTF-8 reader would misread, longest first (the
#: UTF-32-LE mark begins with the UTF-16-LE one).
_FOREIGN_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32-LE"), (b"\x00\x00\xfe\xff", "UTF-32-BE"),
                 (b"\xff\xfe", "UTF-16-LE"), (b"\xfe\xff", "UTF-16-BE"))


def without_byte_order_mark(path: PathLike, data: bytes) -> bytes:
    """The bytes of a UTF-8 text file without a byte-order mark; UTF-16 and UTF-32 are refused.

    :param path: The file, for the message.
    :param data: Its contents.
    :return: ``data`` less a leading UTF-8 byte-order mark.
    :raises ValueError: If ``data`` starts with a UTF-16 or UTF-32 byte-order mark.
    """
    for mark, encoding in _FOREIGN_BOMS:
        if data.startswith(mark):
            raise ValueError(f"{path} is {encoding} text (it starts with a {encoding} byte-order mark); "
                             "save it as UTF-8")
    return data.removeprefix(codecs.BOM_UTF8)


def read_text(path: PathLike) -> str:
    """The contents of a UTF-8 text file, the one way loaders decode the text files they read.

    A UTF-8 byte-order mark (as spreadsheet programs write) is dropped, so it never
    becomes part of the first field. Anything but UTF-8 text is refused with the file's
    name: a UTF-16 or UTF-32 file (recognised by its byte-order mark), a binary file
    (NUL bytes) and invalid UTF-8 (the line and byte are named).

    :param path: The file.
    :return: Its text, newlines untranslated.
    :raises ValueError: If the file is not UTF-8 text.
    """
    data = without_byte_order_mark(path, Path(path).read_bytes())
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ValueError(f"{path} is not UTF-8 text: line {line} has the byte "
                         f"0x{data[error.start]:02x} ({error.reason}); save it as UTF-8") from None
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise ValueError(f"{path} is not a text file: line {line} contains a NUL byte (a binary file, "
                         "or UTF-16 without a byte-order mark); save it as UTF-8 text")
    return text


def random_split(num_items: int, num_train: int, num_test: int,
                 seed: SeedLike) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint random train/test index sets of ``range(num_items)``, each sorted (int64).

    The first ``num_test`` entries of one permutation form the test set, the next
    ``num_train`` the training set, so the same seed always gives the same split.

    :param num_items: Number of items to split.
    :param num_train: Size of the training set.
    :param num_test: Size of the test set (``num_train + num_test <= num_items``).
    :param seed: Seed, converted with :func:`gp_couple._random.as_numpy_generator`.
    :return: ``(train, test)``: the training and test items.
    """
    permutation = as_numpy_generator(seed).permutation(num_items).astype(np.int64)
    test = np.sort(permutation[:num_test])
    train = np.sort(permutation[num_test:num_test + num_train])
    return train, test


def freeze(array: np.ndarray) -> np.ndarray:
    """Mark an array read-only (dataset containers are immutable) and return it.

    :param array: Array owned by the caller.
    :return: The same array, now read-only.
    """
    array.setflags(write=False)
    return array
