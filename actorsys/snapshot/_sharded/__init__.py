"""Snapshots of sharded models (DTensor parameters): which pieces a rank holds, and each rank's writes."""
