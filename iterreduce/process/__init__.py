"""How the runtime's processes live and end: quietly on SIGINT and SIGTERM (:mod:`.stopping`), with
their local launcher however it died (:mod:`.lifeline`, :mod:`.jobfolders`), keeping their memory
in check (:mod:`.memory`)."""
