"""The sweep reads its kinds from one table: a kind's record finds it, deletes it and says
whether it can block a stack's deletion, so a kind added to ORPHAN_KINDS is found, swept, kept
as data and retried around like the others, with no second place naming it. The kinds
themselves, against moto, are in test_teardown.py."""

from __future__ import annotations

from botocore.exceptions import ClientError

from infra.config import resolve_config
from nvrx_eks.ops import teardown_sweep
from nvrx_eks.ops.teardown_sweep import Found, OrphanKind, find_orphans, sweep


def test_a_kind_in_the_table_is_found_swept_and_kept_as_data_by_its_record(monkeypatch):
    deleted: list[str] = []

    def refuse(scope, identifier):
        raise ClientError({"Error": {"Code": "DependencyViolation", "Message": "in use"}}, "DeleteThing")

    kinds = {
        "blocker": OrphanKind(
            lambda scope: iter([Found("b-1", "")]), lambda s, i: deleted.append(i), blocks_stacks=True
        ),
        "thing": OrphanKind(
            lambda scope: iter([Found("t-1", "made by hand"), Found("t-2", "holds data", "its contents")]),
            lambda scope, identifier: deleted.append(identifier),
        ),
        "stuck thing": OrphanKind(lambda scope: iter([Found("s-1", "")]), refuse),
    }
    monkeypatch.setattr(teardown_sweep, "ORPHAN_KINDS", kinds)
    config = resolve_config()

    found = find_orphans(None, config)
    assert [(o.kind, o.identifier) for o in found] == [
        ("blocker", "b-1"),
        ("thing", "t-1"),
        ("thing", "t-2"),
        ("stuck thing", "s-1"),
    ]
    assert [o.identifier for o in find_orphans(None, config, blockers_only=True)] == ["b-1"]

    outcomes = [o.outcome for o in sweep(None, config, found, delete_data=False)]
    assert outcomes == [
        "deleted",
        "deleted",
        "kept (its contents; --delete-data deletes it)",
        "failed: DependencyViolation: in use",
    ]
    assert deleted == ["b-1", "t-1"]
    sweep(None, config, found[2:3], delete_data=True)
    assert deleted == ["b-1", "t-1", "t-2"]
