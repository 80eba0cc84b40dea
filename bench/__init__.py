"""`make bench`: the real server under load, each figure next to a floor measured in the same run."""
