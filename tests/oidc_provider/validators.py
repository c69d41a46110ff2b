"""The claims the test provider vouches for: its users' e-mail, names and groups."""

from __future__ import annotations

from typing import Any

from oauth2_provider.oauth2_validators import OAuth2Validator


class Validator(OAuth2Validator):
    # The groups claim comes with the "groups" scope, as at Keycloak or Okta.
    oidc_claim_scope = {**OAuth2Validator.oidc_claim_scope, "groups": "groups"}

    def get_additional_claims(self, request: Any) -> dict[str, Any]:
        user = request.user
        return {
            "email": user.email,
            # This provider has no verification flow: is_staff stands for "e-mail verified".
            "email_verified": bool(user.is_staff),
            "preferred_username": user.username,
            "given_name": user.first_name,
            "family_name": user.last_name,
            "groups": sorted(user.groups.values_list("name", flat=True)),
        }

    # prompt=none (OpenID Connect Core 1.0 §3.1.2.1): answer at once, without a page. The
    # authorization view itself answers login_required to a person not signed in here
    # (django-oauth-toolkit's handle_no_permission); the client skips the consent screen.
    def validate_silent_login(self, request: Any) -> bool:
        return True

    def validate_silent_authorization(self, request: Any) -> bool:
        return True
