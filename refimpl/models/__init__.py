"""Models as plain functions over refimpl's ops."""
