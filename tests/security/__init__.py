"""Hostile-user tests (issue #12): real unprivileged users on the dev cluster."""
