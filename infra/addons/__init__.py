"""The cluster's add-ons: the catalog of records, and what a config installs of it."""
