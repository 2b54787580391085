"""The columnar index: the JSON index entries compacted into Parquet parts every SQL engine reads."""
