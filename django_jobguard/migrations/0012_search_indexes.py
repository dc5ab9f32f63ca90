# The admin searches whole values over indexed columns: lock keys of jobs, and error classes,
# lock keys and idempotency keys of dead letters. The idempotency keys' unique constraint now
# leads with the key, so a search by key alone uses it; the new one is built before the old
# one goes, so the key is never unguarded.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobguard', '0011_fingerprint_help_text'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='deadletter',
            index=models.Index(fields=['error_class'], name='jobguard_dl_error_idx'),
        ),
        migrations.AddIndex(
            model_name='deadletter',
            index=models.Index(condition=models.Q(('lock_key', ''), _negated=True), fields=['lock_key'], name='jobguard_dl_lock_idx'),
        ),
        migrations.AddIndex(
            model_name='deadletter',
            index=models.Index(condition=models.Q(('idempotency_key__isnull', False)), fields=['idempotency_key'], name='jobguard_dl_idem_idx'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('lock_key', ''), _negated=True), fields=['lock_key'], name='jobguard_job_lock_idx'),
        ),
        migrations.AddConstraint(
            model_name='idempotencykey',
            constraint=models.UniqueConstraint(fields=('key', 'scope'), name='jobguard_idem_key_scope_uniq'),
        ),
        migrations.RemoveConstraint(
            model_name='idempotencykey',
            name='jobguard_idem_scope_key_uniq',
        ),
    ]
