import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('scheduling', '0013_apikey_quota_help'),
    ]

    operations = [
        migrations.AddField(
            model_name='queuedrequest',
            name='changed_by_fairness',
            field=models.BooleanField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='schedulersettings',
            name='fairness',
            field=models.CharField(blank=True, choices=[('keys', 'keys: API keys take turns among equal requests'), ('off', 'off: arrival order')], help_text='keys: requests for the same model at the same priority go by their API keys\' weighted turns. Blank: the config file value.', max_length=8, null=True, verbose_name='fairness'),
        ),
        migrations.AlterField(
            model_name='apikey',
            name='weight',
            field=models.PositiveIntegerField(default=1, help_text='Its share of turns among keys with fairness: keys (2: twice the turns of a key of 1).', validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(1000000)]),
        ),
    ]
