"""Read one keyed state of one stage out of a checkpoint, as an Arrow table (the reading half of
Flink's State Processor API; Spark's ``statestore`` data source).

Every subtask's snapshot of the stage is restored into a scratch directory from durable storage
(sizes and checksums verified, as in any restore) and scanned key group by key group; entries
are decoded with the stage's key codec and the state's spec (state/state_types.py). Columns:
the key's (one per key column), ``key_group``, then by the state's kind

- value: ``value``;
- list: one row per element, ``list_index`` and ``list_element``;
- map: one row per entry, ``user_map_key`` and ``user_map_value``;

and, for a state with a TTL, ``expires_at_ms`` (entries already expired are included: a
checkpoint has no clock to judge them by). A state the checkpoint recorded in another stored
form (its fingerprint) is refused, naming the stage and the state.
"""

from __future__ import annotations

import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from state.errors import BadInputError
from state.manifest import CheckpointManifest
from state.paths import JobLayout
from state.restore import restore_subtask
from state.rocksdb_store import RocksDBStore
from state.state_types import KeyCodec, StateSpec, decode_values
from state.storage import DurableStorage
from state.store_encoding import decode_list
from state.user_state import EXPIRY

_U32 = struct.Struct(">I")


class StateReadError(BadInputError):
    """The checkpoint holds no such state, or holds it in another form; the message says which."""


def read_state(
    manifest: CheckpointManifest,
    storage: DurableStorage,
    uid: str,
    spec: StateSpec,
    codec: KeyCodec,
    key_names: tuple[str, ...],
    scratch: Path,
    layout: JobLayout | None = None,
) -> pa.Table:
    """State ``spec`` of stage ``uid`` in ``manifest``'s checkpoint (its files in ``storage``,
    under its job's directory or ``layout``'s: a savepoint's), keys decoded by ``codec`` into
    columns ``key_names``; ``scratch``: a directory for the restored subtasks, removed as each
    is read."""
    return read_states(manifest, storage, uid, [spec], codec, key_names, scratch, layout)[spec.name]


def read_states(
    manifest: CheckpointManifest,
    storage: DurableStorage,
    uid: str,
    specs: list[StateSpec],
    codec: KeyCodec,
    key_names: tuple[str, ...],
    scratch: Path,
    layout: JobLayout | None = None,
) -> dict[str, pa.Table]:
    """:func:`read_state` of each of ``specs``, restoring each subtask once."""
    where = f"checkpoint {manifest.checkpoint_id} of {manifest.job_id}"
    for spec in specs:
        recorded = manifest.stages.get(uid, {}).get(spec.name)
        if recorded is not None and recorded != spec.fingerprint():
            raise StateReadError(
                f"{where}: stage uid {uid!r} stored state {spec.name!r} as {recorded}, but the "
                f"job declares it as {spec.fingerprint()}"
            )
    found = {spec.name: _Entries() for spec in specs}
    for store in restored_stores(manifest, storage, uid, scratch, layout):
        for spec in specs:
            found[spec.name].scan(store, spec)
    return {spec.name: found[spec.name].table(spec, codec, key_names) for spec in specs}


def restored_stores(
    manifest: CheckpointManifest,
    storage: DurableStorage,
    uid: str,
    scratch: Path,
    layout: JobLayout | None = None,
) -> Iterator[RocksDBStore]:
    """Each subtask of stage ``uid`` in ``manifest``'s checkpoint (its files in ``storage``,
    under its job's directory or ``layout``'s), restored into ``scratch`` and open while the
    caller reads it, removed after; :class:`StateReadError` if the checkpoint holds no state of
    the stage."""
    handles = sorted((h for h in manifest.subtasks if h.operator == uid), key=lambda h: h.subtask)
    if not handles:
        held = sorted({h.operator for h in manifest.subtasks})
        raise StateReadError(
            f"checkpoint {manifest.checkpoint_id} of {manifest.job_id} holds no state of stage "
            f"uid {uid!r} (it holds: {held})"
        )
    for h in handles:
        directory = Path(scratch) / f"{uid}-{h.subtask}"
        restore_subtask(h, storage, layout or JobLayout(manifest.job_id), directory)
        try:
            with RocksDBStore(directory, h.key_group_range) as store:
                yield store
        finally:
            shutil.rmtree(directory, ignore_errors=True)


def scan_state(
    store: RocksDBStore, spec: StateSpec, codec: KeyCodec, key_names: tuple[str, ...]
) -> pa.Table:
    """State ``spec`` as stored in an open ``store`` (every key group it holds), in the columns
    of :func:`read_state` (entries expired but not yet cleaned up included)."""
    entries = _Entries()
    entries.scan(store, spec)
    return entries.table(spec, codec, key_names)


class _Entries:
    """One state's raw entries, gathered over the subtasks."""

    def __init__(self) -> None:
        self.keys: list[bytes] = []
        self.groups: list[int] = []
        self.map_keys: list[bytes] = []  # a map's; nothing for the other kinds
        self.values: list[bytes] = []

    def scan(self, store: RocksDBStore, spec: StateSpec) -> None:
        for kg in store.key_group_range:
            for suffix, value in store.items(spec.name, kg):
                if spec.kind == "map":
                    (n,) = _U32.unpack_from(suffix)
                    self.keys.append(suffix[4 : 4 + n])
                    self.map_keys.append(suffix[4 + n :])
                else:
                    self.keys.append(suffix)
                self.groups.append(kg)
                self.values.append(value)

    def table(self, spec: StateSpec, codec: KeyCodec, key_names: tuple[str, ...]) -> pa.Table:
        return _table(spec, codec, key_names, self.keys, self.groups, self.map_keys, self.values)


def _table(
    spec: StateSpec,
    codec: KeyCodec,
    key_names: tuple[str, ...],
    keys: list[bytes],
    groups: list[int],
    entries: list[bytes],
    values: list[bytes],
) -> pa.Table:
    expiry: list[int] = []
    if spec.ttl is not None:
        expiry = [EXPIRY.unpack_from(v)[0] for v in values]
        values = [v[8:] for v in values]
    rows = list(range(len(keys)))  # the entry each output row comes from
    columns: dict[str, pa.Array] = {}
    if spec.kind == "list":
        items = [decode_list(v) for v in values]
        rows = [i for i, elements in enumerate(items) for _ in elements]
        columns["list_index"] = pa.array([j for e in items for j in range(len(e))], pa.int32())
        columns["list_element"] = decode_values([x for e in items for x in e], spec.type)
    elif spec.kind == "map":
        columns["user_map_key"] = decode_values(entries, spec.key_type)
        columns["user_map_value"] = decode_values(values, spec.type)
    else:
        columns["value"] = decode_values(values, spec.type)
    if spec.ttl is not None:
        columns["expires_at_ms"] = pa.array([expiry[i] for i in rows], pa.int64())
    decoded = codec.decode([keys[i] for i in rows]) if rows else _empty_keys(codec)
    key_columns = decoded.flatten() if codec.composite else [decoded]
    head = dict(zip(key_names, key_columns, strict=True))
    head["key_group"] = pa.array([groups[i] for i in rows], pa.int32())
    return pa.table({**head, **columns})


def _empty_keys(codec: KeyCodec) -> pa.Array:
    types = {"string": pa.string(), "binary": pa.binary(), "int": pa.int32(), "bigint": pa.int64()}
    if not codec.composite:
        return pa.array([], types[codec.key_type])
    fields = [pa.field(n, types[t]) for n, t in zip(codec.names, codec.key_type, strict=True)]
    return pa.array([], pa.struct(fields))
