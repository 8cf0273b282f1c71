"""Processes and sockets of the servers a fleet starts: process groups and their reaper, held
ports, keys and the one health wait.
"""
