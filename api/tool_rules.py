"""The MCP gateway's tool rules over HTTP (docs/api.md, "Tool rules"): thin views over
``ledger.services.tool_rules``.

Worker API (the gateway's worker token, which must serve the agent: the rule of
``PUT /api/agents/{name}``): ``PUT`` reports the tools the gateway proxies, ``GET`` reads
the rules in force. Control API (session or token): ``GET`` the rules (``runs.view_run``),
``PUT`` one tool's rule and ``POST confirm-suggested`` (``ledger.change_toolrule`` and an
``Idempotency-Key``, like every control operation).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.base import (
    AUTH_CODES,
    BODY_CODES,
    api_identity,
    command_schema,
    idempotency_key_parameter,
    problems,
    validated,
)
from api.idempotency import IdempotentMixin
from api.serializers import UtcDateTimeField
from api.worker import WORKER_AUTH_CODES, WorkerApiView
from api.worker_protocol import worker_token
from ledger.models import ToolRule, ToolRuleKind
from ledger.selectors import tool_rules_for_user
from ledger.services import tool_rules as rules
from runs.audit import API
from runs.tokens import serving_for

WORKER_TAGS = ["worker"]
TAGS = ["agents"]


# --- Representations --------------------------------------------------------------------------


class PatternSerializer(serializers.Serializer):
    class Meta:
        ref_name = "ToolRulePattern"

    argument = serializers.CharField(
        max_length=rules.MAX_ARGUMENT, help_text="A top-level argument."
    )
    matches = serializers.CharField(
        max_length=rules.MAX_GLOB,
        help_text="An fnmatch glob over the argument's value as a string (JSON for non-strings).",
    )
    rule = serializers.ChoiceField(choices=ToolRuleKind.choices)


class EffectiveRuleSerializer(serializers.Serializer):
    """What the gateway applies to one tool."""

    class Meta:
        ref_name = "ToolRuleEffective"

    server = serializers.CharField()
    name = serializers.CharField(source="tool")
    rule = serializers.ChoiceField(
        choices=ToolRuleKind.choices,
        source="in_force",
        help_text="The rule in force: `approve` while no person has confirmed one.",
    )
    patterns = serializers.SerializerMethodField()
    confirmed = serializers.BooleanField()
    suggested = serializers.ChoiceField(
        choices=ToolRuleKind.choices, help_text="What the tool's annotations suggest; a hint."
    )
    input_schema = serializers.JSONField()

    @extend_schema_field(PatternSerializer(many=True))
    def get_patterns(self, row: ToolRule) -> list[dict[str, str]]:
        """The patterns in force: none while unconfirmed."""
        return list(row.patterns) if row.confirmed else []


class ToolRuleSerializer(EffectiveRuleSerializer):
    """One tool of an agent's MCP gateway, as people see it."""

    class Meta:
        ref_name = "ToolRule"

    description = serializers.CharField(help_text="The downstream server's text: untrusted.")
    annotations = serializers.JSONField(help_text="The MCP annotations reported: hints.")
    confirmed_rule = serializers.ChoiceField(
        choices=ToolRuleKind.choices, source="rule", allow_null=True
    )
    confirmed_by = serializers.CharField(source="confirmed_actor", allow_blank=True)
    confirmed_at = UtcDateTimeField(allow_null=True)
    changed_since_confirmed = serializers.BooleanField(
        help_text="The gateway reported a different description, schema or annotations "
        "after the rule was confirmed; the rule stays until someone confirms again."
    )
    schema_hash = serializers.CharField(
        source="reported_hash", help_text="Pass it back as `schema_hash` to confirm what you saw."
    )
    offered = serializers.BooleanField(help_text="In the gateway's last report.")
    updated_at = UtcDateTimeField()


class EffectiveRulesSerializer(serializers.Serializer):
    class Meta:
        ref_name = "ToolRulesEffective"

    rules = EffectiveRuleSerializer(many=True)


class ToolRulesSerializer(serializers.Serializer):
    class Meta:
        ref_name = "ToolRules"

    rules = ToolRuleSerializer(many=True)


def effective(rows: list[ToolRule]) -> dict[str, Any]:
    return {"rules": EffectiveRuleSerializer(rows, many=True).data}


def for_people(rows: list[ToolRule]) -> dict[str, Any]:
    return {"rules": ToolRuleSerializer(rows, many=True).data}


# --- The gateway's report --------------------------------------------------------------------


class AnnotationsSerializer(serializers.Serializer):
    """MCP's names (camelCase), as the protocol spells them."""

    class Meta:
        ref_name = "McpToolAnnotations"

    readOnlyHint = serializers.BooleanField(required=False)
    destructiveHint = serializers.BooleanField(required=False)
    idempotentHint = serializers.BooleanField(required=False)
    openWorldHint = serializers.BooleanField(required=False)
    title = serializers.CharField(required=False, max_length=rules.MAX_TITLE)


class ReportedToolSerializer(serializers.Serializer):
    class Meta:
        ref_name = "McpToolReported"

    server = serializers.CharField(
        max_length=64, help_text="The downstream server's name in the gateway's config."
    )
    name = serializers.CharField(max_length=rules.MAX_TOOL_NAME, help_text="The MCP tool name.")
    description = serializers.CharField(
        max_length=rules.MAX_DESCRIPTION, required=False, allow_blank=True
    )
    input_schema = serializers.JSONField(required=False, help_text="At most 32 kB.")
    annotations = AnnotationsSerializer(
        required=False, help_text="MCP annotations (hints); unknown keys are dropped."
    )


class ReportInput(serializers.Serializer):
    class Meta:
        ref_name = "McpToolsReportInput"

    tools = serializers.ListField(
        child=serializers.JSONField(), max_length=rules.MAX_TOOLS, allow_empty=True
    )


class ReportSchemaInput(serializers.Serializer):
    """The documented body (each tool is checked by the service, with JSON pointers)."""

    class Meta:
        ref_name = "McpToolsReport"

    tools = ReportedToolSerializer(many=True, help_text=f"At most {rules.MAX_TOOLS}.")


class McpToolsApi(WorkerApiView):
    """The tools an agent's MCP gateway proxies, and the rule in force for each."""

    @extend_schema(
        tags=WORKER_TAGS,
        operation_id="worker_mcp_tools_read",
        responses={
            200: EffectiveRulesSerializer,
            **problems(*WORKER_AUTH_CODES, "not_found", "agent_not_yours"),
        },
    )
    def get(self, request: Request, name: str) -> Response:
        rows = rules.tool_rules_read(agent=name, serving=serving_for(worker_token(request)))
        return Response(effective(rows))

    @extend_schema(
        tags=WORKER_TAGS,
        operation_id="worker_mcp_tools_report",
        description="Report the tools the gateway proxies now (replaces the last report): "
        "descriptions, schemas and annotations are updated, a person's rule and patterns "
        "kept; a tool not listed is kept and marked not offered. Unconfirmed tools answer "
        "`approve` whatever their annotations suggest.",
        request=ReportSchemaInput,
        parameters=[idempotency_key_parameter(required=False)],
        responses={
            200: EffectiveRulesSerializer,
            **problems(*WORKER_AUTH_CODES, *BODY_CODES, "not_found", "agent_not_yours"),
        },
    )
    def put(self, request: Request, name: str) -> HttpResponse:
        self.idempotency_key(request)
        data = validated(ReportInput, request.data)

        def report() -> Response:
            rows = rules.tool_rules_report(
                agent=name, tools=data["tools"], serving=serving_for(worker_token(request))
            )
            return Response(effective(rows))

        return self.idempotent(request, report)


# --- People ---------------------------------------------------------------------------------


class ToolRuleListApi(APIView):
    """The tools of an agent's MCP gateway: what each suggests, the rule in force, who
    confirmed it and whether the tool changed since."""

    @extend_schema(
        tags=TAGS,
        operation_id="agents_tool_rules",
        responses={200: ToolRulesSerializer, **problems(*AUTH_CODES, "not_found")},
    )
    def get(self, request: Request, name: str) -> Response:
        return Response(for_people(tool_rules_for_user(user=request.user, agent=name)))


class ConfirmInput(serializers.Serializer):
    class Meta:
        ref_name = "ToolRuleConfirmInput"

    rule = serializers.ChoiceField(choices=ToolRuleKind.choices)
    patterns = PatternSerializer(
        many=True, required=False, help_text=f"At most {rules.MAX_PATTERNS}, in order."
    )
    schema_hash = serializers.CharField(
        max_length=64,
        required=False,
        help_text="The tool's `schema_hash` as you saw it: refused (409) if it changed since.",
    )
    comment = serializers.CharField(
        max_length=2000, required=False, allow_blank=True, help_text="Shown in the audit trail."
    )

    def validate_patterns(self, value: list[Any]) -> list[Any]:
        if len(value) > rules.MAX_PATTERNS:
            raise serializers.ValidationError(f"At most {rules.MAX_PATTERNS} patterns.")
        return value


class ToolRuleConfirmApi(IdempotentMixin, APIView):
    """Confirm one tool's rule (and its argument patterns): in force from now on."""

    InputSerializer = ConfirmInput

    @command_schema(
        ConfirmInput,
        {200: ToolRuleSerializer},
        "not_found",
        "invalid_state",
        tags=TAGS,
        operation_id="agents_tool_rule_confirm",
    )
    def put(self, request: Request, name: str, server: str, tool: str) -> HttpResponse:
        tool_rules_for_user(user=request.user, agent=name, write=True)

        def confirm(data: dict[str, Any]) -> dict[str, Any]:
            row = rules.tool_rule_confirm(
                agent=name,
                server=server,
                tool=tool,
                rule=data["rule"],
                patterns=[dict(p) for p in data.get("patterns", [])],
                seen_hash=data.get("schema_hash"),
                comment=data.get("comment", ""),
                user=request.user,
                via=API,
                identity=api_identity(request),
            )
            return dict(ToolRuleSerializer(row).data)

        return self.command(request, confirm)


class ConfirmSuggestedInput(serializers.Serializer):
    class Meta:
        ref_name = "ToolRulesConfirmSuggestedInput"

    comment = serializers.CharField(
        max_length=2000, required=False, allow_blank=True, help_text="Shown in the audit trail."
    )


class ToolRulesConfirmSuggestedApi(IdempotentMixin, APIView):
    """Confirm every unconfirmed tool of the agent with its suggestion; answers every rule."""

    InputSerializer = ConfirmSuggestedInput

    @command_schema(
        ConfirmSuggestedInput,
        {200: ToolRulesSerializer},
        "not_found",
        tags=TAGS,
        operation_id="agents_tool_rules_confirm_suggested",
    )
    def post(self, request: Request, name: str) -> HttpResponse:
        tool_rules_for_user(user=request.user, agent=name, write=True)

        def confirm(data: dict[str, Any]) -> dict[str, Any]:
            rules.tool_rules_confirm_suggested(
                agent=name,
                comment=data.get("comment", ""),
                user=request.user,
                via=API,
                identity=api_identity(request),
            )
            return for_people(rules.tool_rules_for(name))

        return self.command(request, confirm)
