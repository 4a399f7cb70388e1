"""Metadata-service clients and watchers: they translate, they never decide."""
