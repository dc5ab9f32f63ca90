from django.apps import AppConfig


class JobguardBenchConfig(AppConfig):
    name = "benchmarks.jobguard_app"
    label = "jobguard_bench"
