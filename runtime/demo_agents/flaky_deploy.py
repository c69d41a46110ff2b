"""Flaky deploy: watch automatic retries, backoff, and the two ways they stop.

Start it with ``{"service": "checkout", "mode": "transient", "failures": 2}``:

- ``transient``: the rollout fails ``failures`` times, each time with a different
  passing error (a reset connection, a timeout, a 503). Each failure ends the attempt;
  the run backs off (1 s, 2 s, 4 s … with jitter) and a new attempt goes on from the
  checkpoint before the rollout — the build is not repeated. Then it succeeds.
- ``deterministic``: the registry rejects the image. ``ImageRejected`` is in the
  agent's ``non_retryable`` list, so the run stops at once (``deterministic``):
  retrying cannot help until someone changes something.
- ``repeated``: the same health-check timeout every time. After
  ``repeated_error_threshold`` identical errors in a row the run stops
  (``repeated_error``) instead of spending its whole retry budget.

The failures depend on ``ctx.attempt_number`` only to make the demo repeatable; a real
agent simply raises what went wrong.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from runtime.sdk import Agent, Context, Done, Next, RetryPolicy


@dataclass
class Deploy:
    """Which service to deploy, and how the demo should fail."""

    service: Annotated[str, {"minLength": 1, "maxLength": 100}]
    mode: Literal["transient", "deterministic", "repeated", "none"] = "transient"
    failures: Annotated[int, {"minimum": 0, "maximum": 5}] = 2
    pause: Annotated[float, {"minimum": 0, "maximum": 30}] = 0.0


agent = Agent(
    name="flaky-deploy",
    label="Deploy {service}",
    description="Deploys a service and fails on purpose: transient errors with backoff, "
    "a deterministic rejection, or the same error until the repeated-error stop.",
    # A typed input (holdpoint_client/typed.py): the run store checks its JSON Schema, the steps
    # get a Deploy.
    input_schema=Deploy,
    retry=RetryPolicy(
        max_attempts=6,
        backoff_initial=1.0,
        backoff_multiplier=2.0,
        backoff_max=8.0,
        non_retryable=("ImageRejected",),
        repeated_error_threshold=3,
    ),
)


class ImageRejected(Exception):
    """The registry refuses the image: a deterministic failure (see ``non_retryable``)."""


class ServiceUnavailable(Exception):
    """The load balancer answered 503: a transient failure."""


# A different transient error each time, so they do not count as "the same error".
TRANSIENT_ERRORS: list[tuple[type[Exception], str]] = [
    (ConnectionResetError, "connection to the cluster API was reset"),
    (TimeoutError, "rollout did not report progress in time"),
    (ServiceUnavailable, "load balancer answered 503 while draining"),
]


@agent.step("build", start=True)
def build(ctx: Context, state: dict[str, Any]) -> Next | Done:
    service = ctx.input.service
    digest = hashlib.sha256(ctx.run_id.encode()).hexdigest()[:12]
    ctx.sleep(ctx.input.pause)
    ctx.cost("0.02")
    ctx.log(f"built image {service}:{digest}", image=f"{service}:{digest}")
    # The next checkpoint names "rollout": a failed rollout is retried from here.
    return ctx.next("rollout", {"image": f"{service}:{digest}"})


@agent.step("rollout")
def rollout(ctx: Context, state: dict[str, Any]) -> Next | Done:
    mode, failures = ctx.input.mode, ctx.input.failures
    ctx.sleep(ctx.input.pause)
    ctx.cost("0.01")
    if mode == "deterministic":
        raise ImageRejected(f"registry rejected {state['image']}: the image is not signed")
    if mode == "repeated":
        raise TimeoutError(f"health check of {ctx.input.service} timed out")
    if mode == "transient" and ctx.attempt_number <= failures:
        error, message = TRANSIENT_ERRORS[(ctx.attempt_number - 1) % len(TRANSIENT_ERRORS)]
        raise error(message)
    ctx.log(f"rolled out {state['image']}")
    return ctx.next("verify", {**state, "rolled_out_in_attempt": ctx.attempt_number})


@agent.step("verify")
def verify(ctx: Context, state: dict[str, Any]) -> Next | Done:
    return ctx.done({"service": ctx.input.service, **state})
