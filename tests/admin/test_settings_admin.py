"""The scheduler settings page: validation with the config file's messages, audit, precedence, live apply."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.urls import reverse
from django.utils.html import escape

from proxy.config import load_config
from proxy.service import prepare, reset_service
from scheduling.door import frontdoor
from scheduling.operating import settings_store
from scheduling.core import SerialSettings
from scheduling.models import SchedulerSettings, SettingsChange
from scheduling.door.questions import Retune, Snapshot

pytestmark = pytest.mark.django_db

CHANGE_URL = reverse("admin:scheduling_schedulersettings_change", args=[1])


def post_settings(client, aging="", bonus="", slots="", fairness=""):
    return client.post(
        CHANGE_URL,
        {"aging_divisor": aging, "swap_affinity_bonus": bonus, "slots": slots, "fairness": fairness, "_save": "Save"},
    )


CONFIGURED = SerialSettings(aging_divisor=30, swap_affinity_bonus=5, slots={"beta": 2})


def test_the_settings_list_leads_straight_to_the_single_settings_page(admin_client, config_file):
    response = admin_client.get(reverse("admin:scheduling_schedulersettings_changelist"))
    assert response.status_code == 302 and response.url == CHANGE_URL
    page = admin_client.get(CHANGE_URL)
    assert page.status_code == 200
    assert SchedulerSettings.objects.count() == 1
    assert reverse("admin:scheduling_schedulersettings_add") not in page.content.decode()


def test_a_bonus_that_would_cross_a_band_is_refused_with_the_config_files_message(admin_client, config_file):
    response = post_settings(admin_client, bonus="150")
    assert response.status_code == 200
    assert "150 is outside 0..99 — it must stay below the band spacing of 100" in response.content.decode()
    assert SchedulerSettings.load().swap_affinity_bonus is None
    assert not SettingsChange.objects.exists()


def test_a_negative_aging_divisor_is_refused_and_decimals_are_accepted(admin_client, config_file):
    response = post_settings(admin_client, aging="-1")
    assert "-1 is negative — use 0 to disable aging" in response.content.decode()
    assert post_settings(admin_client, aging="45.5").status_code == 302
    assert SchedulerSettings.load().aging_divisor == 45.5


def test_each_changed_value_is_audited_with_who_and_old_and_new(admin_client, admin_user, config_file):
    post_settings(admin_client, bonus="20")
    post_settings(admin_client, aging="90", bonus="20")
    post_settings(admin_client, aging="90", bonus="")
    changes = [(c.changed_by, c.setting, c.old_value, c.new_value) for c in SettingsChange.objects.order_by("id")]
    assert changes == [
        ("admin", "swapAffinityBonus", None, "20"),
        ("admin", "agingDivisor", None, "90"),
        ("admin", "swapAffinityBonus", "20", None),
    ]
    audit = admin_client.get(reverse("admin:scheduling_settingschange_changelist")).content.decode()
    assert "config file value" in audit and "swapAffinityBonus" in audit


def test_the_audit_trail_cannot_be_edited_or_deleted(admin_client, config_file):
    post_settings(admin_client, bonus="20")
    change = SettingsChange.objects.get()
    detail = admin_client.get(reverse("admin:scheduling_settingschange_change", args=[change.pk]))
    assert detail.status_code == 200 and 'name="new_value"' not in detail.content.decode()
    admin_client.post(reverse("admin:scheduling_settingschange_change", args=[change.pk]), {"new_value": "99"})
    delete_url = reverse("admin:scheduling_settingschange_delete", args=[change.pk])
    assert admin_client.post(delete_url, {"post": "yes"}).status_code == 403
    assert SettingsChange.objects.get().new_value == "20"


def test_the_page_says_where_each_value_comes_from(admin_client, config_file):
    page = admin_client.get(CHANGE_URL).content.decode()
    assert "scheduler-in-use\">serial" in page
    assert page.count("config file</td>") == 4
    assert 'id="setting-slots"' in page and "beta: 2</td>" in page
    post_settings(admin_client, bonus="0")
    page = admin_client.get(CHANGE_URL).content.decode()
    assert "admin override by admin at " in page
    assert page.count("config file</td>") == 3


def test_saving_without_a_running_scheduler_says_when_it_will_apply(admin_client, config_file):
    response = post_settings(admin_client, bonus="3")
    page = admin_client.get(response.url, follow=True).content.decode()
    assert "applies the new values when it next starts" in page


def test_an_override_beats_the_config_file_and_blank_falls_back_to_it():
    config = SerialSettings(aging_divisor=30, swap_affinity_bonus=5)
    assert settings_store.stored_serial_settings(config) == config
    SchedulerSettings(swap_affinity_bonus=0).save()
    assert settings_store.stored_serial_settings(config) == SerialSettings(aging_divisor=30, swap_affinity_bonus=0)
    SchedulerSettings(aging_divisor=7.5, swap_affinity_bonus=None).save()
    assert settings_store.stored_serial_settings(config) == SerialSettings(aging_divisor=7.5, swap_affinity_bonus=5)


def test_the_service_starts_with_the_stored_override(config_file):
    SchedulerSettings(swap_affinity_bonus=42).save()
    try:
        prepared = prepare(load_config(str(config_file)))
    finally:
        reset_service()
    assert prepared.serial_settings == SerialSettings(aging_divisor=30, swap_affinity_bonus=42, slots={"beta": 2})
    assert prepared.config.scheduler.serial == CONFIGURED


class RecordingFrontDoor:
    """Stands in for the running scheduler's front door: records what the admin thread asked of it."""

    def __init__(self, config):
        self.config = config
        self.retuned: list[SerialSettings] = []

    def ask_now(self, question):
        return {Retune: self._retune, Snapshot: self._snapshot}[type(question)](question)

    def _retune(self, question: Retune) -> None:
        self.retuned.append(question.settings)

    def _snapshot(self, question: Snapshot):
        in_use = self.retuned[-1] if self.retuned else self.config.scheduler.serial
        return SimpleNamespace(settings=in_use)


@pytest.fixture
def running_scheduler(config_file):
    door = RecordingFrontDoor(load_config(str(config_file)))
    frontdoor.install(door)
    yield door
    frontdoor.install(None)


@pytest.mark.django_db(transaction=True)
def test_a_saved_edit_is_pushed_to_the_running_scheduler_after_commit(admin_client, running_scheduler):
    post_settings(admin_client, bonus="2")
    assert running_scheduler.retuned == [SerialSettings(aging_divisor=30, swap_affinity_bonus=2, slots={"beta": 2})]
    post_settings(admin_client, bonus="2")  # nothing changed: nothing to push
    assert len(running_scheduler.retuned) == 1


def test_slots_are_edited_by_alias_stored_by_model_id_and_audited(admin_client, config_file):
    assert post_settings(admin_client, slots="first: 3\nbeta: 1").status_code == 302
    assert SchedulerSettings.load().slots == {"alpha": 3, "beta": 1}
    page = admin_client.get(CHANGE_URL).content.decode()
    assert "alpha: 3\nbeta: 1</textarea>" in page  # the form shows the override the way it is typed
    assert post_settings(admin_client, slots='{"alpha": 2}').status_code == 302
    post_settings(admin_client, slots="")
    changes = [(c.setting, c.old_value, c.new_value) for c in SettingsChange.objects.order_by("id")]
    assert changes == [
        ("slots", None, "alpha: 3, beta: 1"),
        ("slots", "alpha: 3, beta: 1", "alpha: 2"),
        ("slots", "alpha: 2", None),
    ]
    assert SchedulerSettings.load().slots is None


@pytest.mark.parametrize(
    "slots, expected",
    [
        ("alpha: 0", "alpha: 0 is below the minimum of 1 — e.g. alpha: 4"),
        ("alpha: two", "alpha: expected a whole number, got the string &quot;two&quot;"),
        ("alpha: 2.0", "alpha: expected a whole number, got the number 2.0"),
        ('{"alpha": 2.0}', "alpha: expected a whole number, got the number 2.0"),
        ('{"alpha": 1e2}', "alpha: expected a whole number, got the number 100.0"),
        ('{"alpha": true}', "alpha: expected a whole number, got the bool true"),
        ('{"alpha": 2, "alpha": 3}', "&#x27;alpha&#x27; is listed twice — JSON would keep only the last one"),
        ("ghost: 2", "no model or alias is called &quot;ghost&quot; — use a model ID or alias from `models:`"),
        ("alpha: 2\nfirst: 3", "&quot;first&quot; is model alpha, whose slots are already set by &quot;alpha&quot;"),
        ("alpha: 2\nalpha: 3", "&#x27;alpha&#x27; is listed twice"),
        ("alpha 2", "is not `model: N`"),
        ("[1, 2]", "not `model: N`"),
        ('{"alpha": 2', "not valid JSON"),
        ('{"alpha": ' + "[" * 100_000 + "]" * 100_000 + "}", "not valid JSON (nested too deeply)"),
    ],
)
def test_bad_slots_are_refused_with_what_to_write(admin_client, config_file, slots, expected):
    response = post_settings(admin_client, slots=slots)
    assert response.status_code == 200
    assert expected in response.content.decode()
    assert SchedulerSettings.load().slots is None
    assert not SettingsChange.objects.exists()


def test_a_slots_override_replaces_the_config_files_slots_and_blank_falls_back():
    assert settings_store.stored_serial_settings(CONFIGURED) == CONFIGURED
    SchedulerSettings(slots={"alpha": 4}).save()
    in_force = settings_store.stored_serial_settings(CONFIGURED)
    assert (in_force.slots_for("alpha"), in_force.slots_for("beta")) == (4, 1)
    assert in_force.aging_divisor == 30


@pytest.mark.django_db(transaction=True)
def test_a_slots_edit_reaches_the_running_scheduler(admin_client, running_scheduler):
    post_settings(admin_client, slots="alpha: 2")
    assert [dict(settings.slots) for settings in running_scheduler.retuned] == [{"alpha": 2}]


@pytest.mark.django_db(transaction=True)
def test_fair_share_is_turned_on_live_audited_and_blank_falls_back_to_the_config(admin_client, admin_user,
                                                                                 running_scheduler):
    assert post_settings(admin_client, fairness="keys").status_code == 302
    assert [settings.fairness for settings in running_scheduler.retuned] == ["keys"]
    change = SettingsChange.objects.get()
    assert (change.setting, change.old_value, change.new_value) == ("fairness", None, "keys")
    post_settings(admin_client)
    assert running_scheduler.retuned[-1].fairness == "off"  # the config file's


def test_a_fairness_the_admin_refuses_written_some_other_way_is_left_out(caplog):
    SchedulerSettings.objects.update_or_create(pk=1, defaults={"fairness": "users"})
    assert settings_store.stored_serial_settings(CONFIGURED) == CONFIGURED
    assert "ignoring the admin's fairness override 'users'" in caplog.text


@pytest.mark.parametrize("count", ["0", "2.0", "two", "true"])
def test_the_admin_refuses_a_slot_count_in_the_config_files_words(admin_client, config_error_for, count):
    message = config_error_for(f"{{alpha: {count}}}")
    response = post_settings(admin_client, slots=f"alpha: {count}" if count != "true" else '{"alpha": true}')
    assert escape(f"alpha: {message}") in response.content.decode()


@pytest.fixture
def config_error_for(config_file):
    """The config file's message (after the key path) for `slots` set to the given YAML mapping."""
    from proxy.config import ConfigError

    def message(slots: str) -> str:
        text = config_file.read_text().replace("slots: {beta: 2}", f"slots: {slots}")
        bad = config_file.with_name("bad.yaml")
        bad.write_text(text)
        with pytest.raises(ConfigError) as error:
            load_config(str(bad))
        line = next(line for line in str(error.value).splitlines() if ".serial.slots.alpha: " in line)
        return line.split(".serial.slots.alpha: ", 1)[1]

    return message


STALE = {"alpha": 3, "gone": 2}  # `gone` was a model when the override was saved; the config has dropped it


def test_an_override_entry_for_a_model_no_longer_configured_is_shown_as_not_applied(admin_client, config_file):
    SchedulerSettings(slots=STALE).save()
    page = admin_client.get(CHANGE_URL).content.decode()
    assert 'id="ignored-slots"' in page
    assert "gone: 2 — not a configured model; it applies again once the config has it" in page
    assert "alpha: 3\ngone: 2</textarea>" in page


def test_a_stale_override_entry_does_not_block_editing_other_settings(admin_client, config_file):
    SchedulerSettings(slots=STALE).save()
    assert post_settings(admin_client, aging="45", slots="alpha: 3\ngone: 2").status_code == 302
    assert SchedulerSettings.load().slots == STALE  # kept: it applies again once `gone` is configured
    assert [(c.setting, c.new_value) for c in SettingsChange.objects.all()] == [("agingDivisor", "45")]


def test_a_stale_override_entry_can_be_dropped_but_not_changed_or_added(admin_client, config_file):
    SchedulerSettings(slots=STALE).save()
    response = post_settings(admin_client, slots="alpha: 3\ngone: 5")
    assert "no model or alias is called &quot;gone&quot;" in response.content.decode()
    assert post_settings(admin_client, slots="alpha: 3").status_code == 302
    assert [(c.setting, c.old_value, c.new_value) for c in SettingsChange.objects.all()] == [
        ("slots", "alpha: 3, gone: 2", "alpha: 3")
    ]
    assert 'id="ignored-slots"' not in admin_client.get(CHANGE_URL).content.decode()


def test_the_scheduler_leaves_out_a_stale_or_invalid_entry_and_says_so(caplog):
    SchedulerSettings(slots={**STALE, "beta": 2.0}).save()  # 2.0: what an older admin stored
    in_force = settings_store.stored_serial_settings(CONFIGURED, models={"alpha", "beta"})
    assert dict(in_force.slots) == {"alpha": 3}
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("slots override gone: 2: not a configured model" in w for w in warnings), warnings
    assert any("slots override beta: 2.0: expected a whole number" in w for w in warnings), warnings


@pytest.mark.django_db(transaction=True)
def test_a_stale_entry_never_reaches_the_running_scheduler(admin_client, running_scheduler):
    SchedulerSettings(slots=STALE).save()
    post_settings(admin_client, bonus="2", slots="alpha: 3\ngone: 2")
    assert [dict(settings.slots) for settings in running_scheduler.retuned] == [{"alpha": 3}]
