"""One module per part of the course: its exercises, their hints, and its planted mistakes."""
