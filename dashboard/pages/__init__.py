"""What the dashboard's pages show, built from the person who looks and the data.

Each builder takes a user (or a request, for the parts that need one) and returns the
context a template renders, or the rows and cards it lists. The views
(``dashboard.views``) render them for a page load or an action; the live sockets
(``live.consumers``) render the same ones again after every push. Builders import no
view: ``live`` may import this package, never ``dashboard.views`` (pyproject.toml's
import contracts, ``tests/runs/test_one_rule.py``).
"""
