"""Optional integrations that sit on top of django-jobguard: nothing in the package imports them."""
