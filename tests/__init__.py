"""The suite ``make test`` runs (a package, so support code imports as ``tests.…``)."""
