"""Test doubles for the tools the launcher calls (docker, ssh, ip, ss) and fake endpoints."""
