"""A real OpenID provider for the sign-in tests (tests/oidc): a small Django project with
django-oauth-toolkit, started by ``python -m tests.oidc_provider.serve`` in a process of its
own, on its own port, with its own SQLite database. Not a mock: Holdpoint talks to it over
HTTP exactly as to a company's provider (discovery, authorization, token, userinfo, JWKS).
"""
