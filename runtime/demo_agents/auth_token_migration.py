"""Auth token migration — the seed's example, and a tour of the SDK.

1. ``inspect`` reads the versioned auth config (``staging/auth/config`` in the config
   store) with ``ctx.observe``: it is volatile, so every run of a step reads it again.
2. ``choose`` asks a person "请选择需要保持兼容的 Token 版本" with the schema
   ``{versions: "string[]"}``. The step runs again when the answer comes, re-reads the
   config, and ``ctx.changed("config")`` says whether someone edited it meanwhile.
3. ``approve`` asks for approval of ``update_auth_config`` on the document (the
   config-store write is compensable: restoring the previous version undoes the file).
   The approval's key names the config version it was asked on, so an edit made while
   waiting asks again (the new card says the earlier approval was not applied, and why);
   ``write`` then writes the new version through ``ctx.side_effect``. The approvers may
   edit the versions first, choosing among those the config has; an edit the config can
   no longer carry out is refused (``EditRefused``) and asked again.
4. ``notify`` e-mails the owners. E-mail is irreversible, so the ledger asks for
   approval first unless the run was started with it (``--approve notify.email``).

Start it with ``{"notify": "auth-team@example.com"}``. On an empty config store the
first step writes a demo config first (through the ledger too), so the demo runs on a
fresh machine.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from ledger.tools.config_store import ConfigStore
from runtime.sdk import Agent, Context, Deterministic, Done, EditRefused, Next, RetryPolicy

DOCUMENT = "staging/auth/config"

agent = Agent(
    name="auth-token-migration",
    label="Migrate tokens for {notify}",
    description="Narrows the token versions the staging auth service accepts: asks which "
    "to keep, asks approval for the config change, writes it, e-mails the owners.",
    input_schema={
        "type": "object",
        "properties": {
            "document": {"type": "string", "minLength": 1, "maxLength": 200},
            "notify": {
                "type": "string",
                "pattern": "^[^@\\s]+@[^@\\s]+$",
                "format": "email",
                "title": "Notify",
                "description": "Who is told when the config changes (an e-mail address)",
            },
        },
        "required": ["notify"],
        "additionalProperties": False,
    },
    retry=RetryPolicy(max_attempts=3, backoff_initial=1.0, non_retryable=("UnknownTokenVersion",)),
    tools=("config_store", "email"),
)

# What an empty demo store starts with.
DEMO_CONFIG: dict[str, Any] = {
    "issuer": "https://auth.staging.example",
    "token_versions": {
        "v1": {"alg": "HS256", "introduced": "2021-03"},
        "v2": {"alg": "RS256", "introduced": "2023-01"},
        "v3": {"alg": "ES256", "introduced": "2025-06"},
    },
    "accepted_versions": ["v1", "v2", "v3"],
}


class UnknownTokenVersion(Exception):
    """The answer names a token version the config does not have (deterministic)."""


def versions_schema(available: list[str]) -> dict[str, Any]:
    """What an approver may edit: the versions to accept, among those the config has (the
    form shows one checkbox each; the service refuses any other value, with a pointer)."""
    return {
        "type": "object",
        "properties": {
            "accepted_versions": {
                "type": "array",
                "title": "Accepted versions",
                "description": "the token versions the config accepts (at least one)",
                "items": {"type": "string", "enum": available},
                "uniqueItems": True,
                "minItems": 1,
            }
        },
        "required": ["accepted_versions"],
        "additionalProperties": False,
    }


def read_config(document: str) -> dict[str, Any] | None:
    """The newest version of the document, as plain JSON (None when there is none)."""
    version = ConfigStore(settings.HOLDPOINT_CONFIG_STORE_DIR).read(document)
    if version is None or version.deleted:
        return None
    return {"version": version.version, "content": version.content}


@agent.step("inspect", start=True)
def inspect(ctx: Context, state: dict[str, Any]) -> Next | Done:
    document = ctx.input.get("document", DOCUMENT)
    config = ctx.observe("config", read_config, document)
    if config is None:
        # Demo scaffolding: seed the empty store, then inspect again from a new checkpoint.
        ctx.side_effect(
            "config_store", document, {"document": document, "content": DEMO_CONFIG}, key="seed"
        )
        ctx.log(f"seeded {document} with the demo config")
        return ctx.next("inspect", {})
    ctx.log(
        f"{document} v{config['version']} accepts {', '.join(config['content']['accepted_versions'])}"
    )
    return ctx.next("choose", {"document": document})


@agent.step("choose")
def choose(ctx: Context, state: dict[str, Any]) -> Next | Done:
    # Re-read on every run of the step: the answer may come hours later.
    config = ctx.observe("config", read_config, state["document"])
    if config is None:
        raise Deterministic(f"{state['document']} was deleted")
    available = sorted(config["content"]["token_versions"])
    answer = ctx.ask(
        "请选择需要保持兼容的 Token 版本",
        {"versions": "string[]"},
        expires_in=24 * 3600,
        context={
            "document": state["document"],
            "config_version": config["version"],
            "available_versions": available,
            "accepted_now": config["content"]["accepted_versions"],
            # An approver sent the last plan back with this comment (issue 18).
            **({"approver_feedback": state["feedback"]} if state.get("feedback") else {}),
        },
    )
    if ctx.changed("config"):
        ctx.log("the config changed while the question was open; planning on the new version")
    keep = sorted(set(answer["versions"]))
    unknown = [v for v in keep if v not in available]
    if unknown or not keep:
        raise UnknownTokenVersion(
            f"cannot keep {', '.join(unknown) or 'nothing'}; the config has {', '.join(available)}"
        )
    return ctx.next("approve", {**state, "keep": keep})


@agent.step("approve")
def approve(ctx: Context, state: dict[str, Any]) -> Next | Done:
    document = state["document"]
    config = ctx.observe("config", read_config, document)
    if config is None:
        raise Deterministic(f"{document} was deleted")
    # The key names the version the approval is about: if someone edits the config while
    # the approval is pending, the re-run asks about the change it would now make.
    # The approver may edit the versions before approving (the card's form), or send the
    # plan back with a comment: then the step asks again which versions to keep.
    available = sorted(config["content"]["token_versions"])
    approval = ctx.approve(
        "update_auth_config",
        document,
        {
            "accepted_versions": {
                "from": sorted(config["content"]["accepted_versions"]),
                "to": state["keep"],
            },
            "base_version": config["version"],
        },
        expires_in=24 * 3600,
        tool="config_store",
        key=f"approve-v{config['version']}",
        editable=versions_schema(available),
        arguments={"accepted_versions": state["keep"]},
    )
    if approval.unchanged:
        # The config already accepts exactly these versions: nothing to write or announce.
        return ctx.done({"changed": False, "accepted_versions": state["keep"]})
    if approval.responded:
        ctx.log(f"update_auth_config sent back by {approval.answered_by}: {approval.comment}")
        return ctx.next("choose", {"document": document, "feedback": approval.comment})
    if approval.denied:
        ctx.log(f"update_auth_config denied by {approval.answered_by}: {approval.comment}")
        return ctx.done({"changed": False, "denied_by": approval.answered_by})
    keep = state["keep"]
    if approval.edited is not None:
        keep = sorted(set(approval.edited["accepted_versions"]))
        unknown = [v for v in keep if v not in config["content"]["token_versions"]]
        if unknown:
            # A version the form offered is gone (or the request was asked before the form
            # named them): nothing is written, and the approvers are asked again, told why.
            raise EditRefused(
                f"{document} v{config['version']} has no token version {', '.join(unknown)} "
                f"(it has {', '.join(available)})"
            )
        ctx.log(f"update_auth_config approved with edits: accepted versions {keep}")
    state = {**state, "keep": keep}
    content = {**config["content"], "accepted_versions": keep}
    return ctx.next("write", {**state, "content": content, "base_version": config["version"]})


@agent.step("write")
def write(ctx: Context, state: dict[str, Any]) -> Next | Done:
    # Its own step, so that a re-run (after a crash) repeats only this call, which the
    # ledger answers from its record instead of writing twice.
    written = ctx.side_effect(
        "config_store",
        state["document"],
        {"document": state["document"], "content": state["content"]},
    )
    return ctx.next(
        "notify",
        {
            "document": state["document"],
            "keep": state["keep"],
            "written": written.external_reference,
            "previous_version": state["base_version"],
        },
    )


@agent.step("notify")
def notify(ctx: Context, state: dict[str, Any]) -> Next | Done:
    sent = ctx.side_effect(
        "email",
        ctx.input["notify"],
        {
            "to": [ctx.input["notify"]],
            "subject": f"{state['document']}: token versions now {', '.join(state['keep'])}",
            "body": (
                f"{state['written']} accepts only {', '.join(state['keep'])}.\n"
                f"Restore version {state['previous_version']} to undo the file."
            ),
        },
    )
    return ctx.done(
        {
            "document": state["document"],
            "accepted_versions": state["keep"],
            "written": state["written"],
            "notified": sent.external_reference,
        }
    )
