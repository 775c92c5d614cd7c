"""Model families kept outside harness/models/, for tests: each is one folder, registered by its module path."""
