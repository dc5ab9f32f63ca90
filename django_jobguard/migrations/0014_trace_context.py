from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobguard", "0013_flow_control"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="trace_context",
            field=models.JSONField(
                blank=True,
                editable=False,
                help_text="W3C trace context of the enqueue (with OPENTELEMETRY on); NULL without.",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="deadletter",
            name="trace_context",
            field=models.JSONField(
                blank=True,
                editable=False,
                help_text="The dead job's trace context; a replay links to it.",
                null=True,
            ),
        ),
    ]
