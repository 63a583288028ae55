from django.apps import AppConfig


class ProxyConfig(AppConfig):
    name = "proxy"
    verbose_name = "Proxy"

    def ready(self) -> None:
        from proxy.service import config_for_pages
        from scheduling.door import frontdoor

        frontdoor.set_config_loader(config_for_pages)
