"""What a running pair is doing: ``status`` (``pair``), its views (``view``), the one
``/metrics`` parser and serving figures (``metrics``), and the watchdog (``watch``)."""
