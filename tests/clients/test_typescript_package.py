"""The TypeScript client as an agent outside this repository gets it: ``npm pack`` makes a
package (built on the way), ``npm install /path/to/holdpoint-client-X.tgz`` installs it,
and an agent imports ``holdpoint-client`` by its name (not ``../dist``), with its types,
and runs the ``holdpoint-worker`` bin it brings."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.clients.node import CLIENT, build, npm

pytestmark = pytest.mark.process

AGENT = """\
import { Agent } from "holdpoint-client";

export const hello = new Agent({ name: "pkg-hello", inputSchema: { name: "string" } });
hello.step("greet", async (ctx) => ctx.done({ greeting: `Hello, ${ctx.input.name}` }));
"""

TYPED = """\
import { Agent, Transient, type Context, type RetryPolicy, type Tool, type ToolResult } from "holdpoint-client";

const retry: RetryPolicy = { max_attempts: 3, backoff_initial: 1 };
const tool: Tool = {
  name: "ticket",
  reversibility: "compensable",
  async execute(request: unknown, key: string): Promise<ToolResult> {
    return { externalReference: key, result: request };
  },
  async lookup() {
    return null;
  },
};
export const typed = new Agent({ name: "pkg-typed", retry, tools: [tool] });
typed.step("go", async (ctx: Context) => {
  if (ctx.attemptNumber > 5) throw new Transient("later");
  const facts: string[] = [ctx.runId, ctx.attemptId, ctx.attemptReason, ctx.step, ctx.checkpointId];
  return ctx.done({ facts, resumed: ctx.resumed, version: ctx.agentVersion });
});
"""


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, f"{command}: {result.stdout[-3000:]}{result.stderr[-3000:]}"
    return result


def test_an_agent_outside_the_repository_installs_the_packed_client(tmp_path: Path) -> None:
    build()  # (the compiler in node_modules, for the checkout below)
    command = npm()
    # A fresh checkout of the client, never built: npm pack builds it on the way.
    checkout = tmp_path / "holdpoint-client"
    checkout.mkdir()
    for name in ("package.json", "package-lock.json", "tsconfig.json", "README.md"):
        shutil.copy(CLIENT / name, checkout / name)
    shutil.copytree(CLIENT / "src", checkout / "src")
    (checkout / "node_modules").symlink_to(CLIENT / "node_modules")
    packs = tmp_path / "packs"
    packs.mkdir()
    packed = run([command, "pack", "--json", "--pack-destination", str(packs)], checkout)
    [info] = json.loads(packed.stdout[packed.stdout.index("[") :])
    tarball = packs / info["filename"]
    assert info["name"] == "holdpoint-client"
    with tarfile.open(tarball) as archive:
        names = set(archive.getnames())
    for shipped in ("dist/index.js", "dist/index.d.ts", "dist/cli.js", "package.json", "README.md"):
        assert f"package/{shipped}" in names
    assert not [n for n in names if n.startswith(("package/src/", "package/test/"))]

    project = tmp_path / "my-agents"
    project.mkdir()
    (project / "package.json").write_text(
        json.dumps({"name": "my-agents", "private": True, "type": "module"})
    )
    run([command, "install", "--offline", "--no-audit", "--no-fund", str(tarball)], project)
    manifest = json.loads((project / "package.json").read_text())
    assert "holdpoint-client" in manifest["dependencies"]

    (project / "agents.mjs").write_text(AGENT)
    loaded = run(
        [
            "node",
            "--input-type=module",
            "-e",
            'import { hello } from "./agents.mjs"; import * as hp from "holdpoint-client";'
            "console.log(JSON.stringify({agent: hello.name, steps: [...hello.steps.keys()],"
            " exports: Object.keys(hp).sort()}));",
        ],
        project,
    )
    seen = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert seen["agent"] == "pkg-hello" and seen["steps"] == ["greet"]
    for name in ("Agent", "Worker", "Context", "Next", "Done", "Transient", "Deterministic"):
        assert name in seen["exports"]

    # The bin comes with it, and answers --help (no server needed).
    bin_path = project / "node_modules" / ".bin" / "holdpoint-worker"
    helped = run([str(bin_path), "--help"], project)
    assert helped.stdout.startswith("usage: holdpoint-worker")

    # The types come with it: a TypeScript agent compiles against the installed package.
    (project / "typed.ts").write_text(TYPED)
    tsc = CLIENT / "node_modules" / ".bin" / "tsc"
    run(
        [
            str(tsc),
            "--noEmit",
            "--strict",
            "--target",
            "ES2022",
            "--module",
            "NodeNext",
            "--moduleResolution",
            "NodeNext",
            "--skipLibCheck",
            "--typeRoots",
            str(CLIENT / "node_modules" / "@types"),
            "typed.ts",
        ],
        project,
    )
    assert os.path.exists(project / "node_modules" / "holdpoint-client" / "dist" / "index.d.ts")
