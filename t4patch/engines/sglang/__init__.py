"""SGLang: attention driver, Marlin module loader, skeleton importer and doctor readiness checks."""
