"""The values an agent's steps return and the errors they raise: defined once, in the agent
SDK (``holdpoint_client/types.py``); named here for the server's modules."""

from __future__ import annotations

from holdpoint_client import types as _sdk

Approval = _sdk.Approval
ApprovalDenied = _sdk.ApprovalDenied
ApprovalNotApplied = _sdk.ApprovalNotApplied
Confirmed = _sdk.Confirmed
CostBudgetExceeded = _sdk.CostBudgetExceeded
Deterministic = _sdk.Deterministic
Done = _sdk.Done
EditRefused = _sdk.EditRefused
Next = _sdk.Next
SideEffectFailed = _sdk.SideEffectFailed
StepError = _sdk.StepError
Transient = _sdk.Transient
