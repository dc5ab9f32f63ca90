"""The outbox's tables (messages, the publish side and the relay side of each key).

On MariaDB/MySQL the destination, key and lease token columns get the NO PAD binary collation
of the other key columns (see 0022): ``order:1`` and ``ORDER:1 `` are two keys, with two
orders, as on PostgreSQL and SQLite.
"""

import django.db.models.functions.datetime
from django.db import migrations, models

from ._operations import MySQLKeyCollation

#: (table, column, max_length, nullable): the outbox's key columns, as the models declare them.
COLUMNS = [
    ("jobguard_outboxmessage", "destination", 100, False),
    ("jobguard_outboxmessage", "key", 200, False),
    ("jobguard_outboxkey", "destination", 100, False),
    ("jobguard_outboxkey", "key", 200, False),
    ("jobguard_outboxcursor", "destination", 100, False),
    ("jobguard_outboxcursor", "key", 200, False),
    ("jobguard_outboxcursor", "lease_token", 64, False),
]


class Migration(migrations.Migration):

    dependencies = [
        ('jobguard', '0029_notify_progress_watched'),
    ]

    operations = [
        migrations.CreateModel(
            name='OutboxCursor',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('destination', models.CharField(max_length=100)),
                ('key', models.CharField(max_length=200)),
                ('delivered_seq', models.BigIntegerField(default=0)),
                ('held_seq', models.BigIntegerField(blank=True, null=True)),
                ('lease_token', models.CharField(blank=True, default='', max_length=64)),
                ('lease_until', models.DateTimeField(blank=True, null=True)),
                ('retry_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'verbose_name': 'outbox cursor',
                'verbose_name_plural': 'outbox cursors',
                'constraints': [models.UniqueConstraint(fields=('destination', 'key'), name='jobguard_outbox_cursor_uniq')],
                'indexes': [models.Index(condition=models.Q(('lease_token', ''), _negated=True), fields=['destination'], name='jobguard_outbox_leased')],
            },
        ),
        migrations.CreateModel(
            name='OutboxKey',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('destination', models.CharField(max_length=100)),
                ('key', models.CharField(max_length=200)),
                ('last_seq', models.BigIntegerField(default=0)),
            ],
            options={
                'verbose_name': 'outbox key',
                'verbose_name_plural': 'outbox keys',
                'constraints': [models.UniqueConstraint(fields=('destination', 'key'), name='jobguard_outbox_key_uniq')],
            },
        ),
        migrations.CreateModel(
            name='OutboxMessage',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('message_id', models.UUIDField(editable=False, unique=True)),
                ('destination', models.CharField(max_length=100)),
                ('key', models.CharField(max_length=200)),
                ('seq', models.BigIntegerField()),
                ('payload', models.JSONField()),
                ('headers', models.JSONField(blank=True, default=dict)),
                ('published_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now(), editable=False)),
                ('state', models.CharField(choices=[('pending', 'pending'), ('delivered', 'delivered'), ('dead', 'dead'), ('skipped', 'skipped')], default='pending', max_length=16)),
                ('attempts', models.IntegerField(default=0)),
                ('next_attempt_at', models.DateTimeField(blank=True, null=True)),
                ('last_error', models.TextField(blank=True, default='')),
                ('delivered_at', models.DateTimeField(blank=True, null=True)),
                ('resolution', models.CharField(blank=True, default='', max_length=16)),
                ('resolved_by', models.CharField(blank=True, default='', max_length=150)),
                ('resolution_reason', models.TextField(blank=True, default='')),
                ('resolved_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'verbose_name': 'outbox message',
                'verbose_name_plural': 'outbox messages',
                'permissions': [('operate_outbox', 'Can replay and skip outbox messages')],
                'indexes': [models.Index(condition=models.Q(('state', 'pending')), fields=['destination', 'key', 'id'], name='jobguard_outbox_pending'), models.Index(condition=models.Q(('state', 'dead')), fields=['destination', 'id'], name='jobguard_outbox_dead')],
                'constraints': [models.UniqueConstraint(fields=('destination', 'key', 'seq'), name='jobguard_outbox_seq_uniq')],
            },
        ),
        MySQLKeyCollation(COLUMNS, previous="utf8mb4_bin"),
    ]
