"""A job knows whether another job waits for it, so an ack of jobs nobody waits for skips the lookup.

The column is set where a dependency is stored (a chain's steps, ``after=``, a replay taking
a dead step's place); existing dependencies mark their parents here.
"""

from django.db import migrations, models


def mark_parents(apps, schema_editor):
    alias = schema_editor.connection.alias
    Job = apps.get_model("jobguard", "Job")
    JobDependency = apps.get_model("jobguard", "JobDependency")
    parents = JobDependency.objects.using(alias).values("parent_id")
    Job.objects.using(alias).filter(pk__in=parents).update(has_dependants=True)


class Migration(migrations.Migration):
    dependencies = [
        ("jobguard", "0019_mysql_exact_names"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="has_dependants",
            field=models.BooleanField(
                db_default=False,
                editable=False,
                help_text="Another job waits for this one to succeed (a chain's next step, or after=).",
            ),
        ),
        migrations.RunPython(mark_parents, migrations.RunPython.noop, elidable=True),
    ]
