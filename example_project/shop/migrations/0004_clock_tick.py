from django.db import migrations


class Migration(migrations.Migration):
    """The recurring demo job is the clock: "heartbeat" names the renewal of a worker's leases."""

    dependencies = [
        ("shop", "0003_heartbeat"),
    ]

    operations = [
        migrations.RenameModel(old_name="Heartbeat", new_name="ClockTick"),
        migrations.RenameField(model_name="clocktick", old_name="beat_at", new_name="ticked_at"),
    ]
