"""The dashboard (/dashboard) and the program trace explorer (/dashboard/programs), in the HTTP process.

hub.py asks the scheduler(s) for snapshots and builds the page's JSON; timeline.py keeps request timelines
and rates; programs.py stores the program traces that clients post; routes.py serves it all, with the
static page (static/: hand-written HTML, JS and CSS, no build step, nothing from a CDN).
"""
