"""The shipped profiles: package data, installed as `cockpit.shipped_profiles`."""
