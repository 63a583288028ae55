"""The queue and models pages in a process that does not serve, and who may act on them."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

pytestmark = pytest.mark.django_db

QUEUE = reverse("admin:scheduling_waitingrequest_changelist")
MODELS = reverse("admin:scheduling_configuredmodel_changelist")


@pytest.mark.parametrize("url", [QUEUE, MODELS])
def test_without_a_running_scheduler_the_page_says_where_to_look(admin_client, url):
    page = admin_client.get(url)
    assert page.status_code == 200
    assert "the scheduler is not running in this process" in page.content.decode()
    refused = admin_client.post(url, {"action": "cancel", "ticket": ["1"], "model": "alpha"}, follow=True)
    assert "the scheduler is not running in this process" in refused.content.decode()


def test_the_index_links_the_operators_pages(admin_client):
    index = admin_client.get(reverse("admin:index")).content.decode()
    for url in (QUEUE, MODELS, reverse("admin:scheduling_schedulersettings_changelist"),
                reverse("admin:scheduling_queuedrequest_changelist")):
        assert f'href="{url}"' in index
    assert reverse("admin:scheduling_schedulersettings_add") not in index


@pytest.mark.parametrize(("url", "codename"), [(QUEUE, "view_waitingrequest"), (MODELS, "view_configuredmodel")])
def test_viewers_may_look_but_not_act(client, url, codename):
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    client.force_login(viewer)
    assert client.get(url).status_code == 403
    viewer.user_permissions.add(Permission.objects.get(codename=codename))
    assert client.get(url).status_code == 200
    assert client.post(url, {"action": "cancel", "ticket": ["1"], "model": "alpha"}).status_code == 403
