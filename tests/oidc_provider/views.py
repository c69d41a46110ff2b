"""The test's hand on the provider: create or change a user and their groups, as the
company's directory would. Guarded by the provider's secret, which only the test knows."""

from __future__ import annotations

import hmac
import json

from django.conf import settings
from django.contrib.auth.hashers import check_password
from django.contrib.auth.models import Group, User
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt


@csrf_exempt
def users(request: HttpRequest) -> HttpResponse:
    expected = f"Bearer {settings.SECRET_KEY}"
    if not hmac.compare_digest(request.headers.get("Authorization", ""), expected):
        return HttpResponse(status=403)
    if request.method != "POST":
        return HttpResponse(status=405)
    data = json.loads(request.body)
    user, _ = User.objects.get_or_create(username=data["username"])
    user.email = data.get("email", "")
    user.is_staff = bool(data.get("email_verified", True))
    user.first_name = data.get("first_name", "")
    user.last_name = data.get("last_name", "")
    # hashers.check_password, not user.check_password: the latter may rehash the password
    # (a new salt), which would end the person's sessions here as a new password does.
    if not check_password(data["password"], user.password):
        # Only a new password changes it: a change signs the person out here (Django ends
        # the sessions of a changed password), which a test may want, but not by accident.
        user.set_password(data["password"])
    user.save()
    user.groups.set([Group.objects.get_or_create(name=name)[0] for name in data.get("groups", [])])
    return JsonResponse({"sub": str(user.pk)})
