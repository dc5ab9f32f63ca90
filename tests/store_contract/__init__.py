"""The store contract suite: what every database's dialect must do, run on the database under test."""
