# Build and test ngx_http_agent_module.
#
#   make          the dynamic module, against Debian's nginx-dev, with the
#                 flags Debian's own nginx binary was configured with
#   make test     the test suite against the stock /usr/sbin/nginx
#   make asan     a full nginx 1.22.1 from Debian's source package with
#                 AddressSanitizer and UBSan, and the test suite against it
#   make demo     nginx in the foreground with nginx.conf.example

NGINX_SRC ?=	/usr/share/nginx/src
NGINX_BIN ?=	/usr/sbin/nginx
B :=		$(CURDIR)/build
MODULE :=	$(B)/nginx/objs/ngx_http_agent_module.so
SOURCES :=	$(wildcard src/*.c src/*.h src/*/*.c src/*/*.h)
JOBS ?=		$(shell nproc 2>/dev/null || echo 2)
PROVE ?=	prove
PROVE_FLAGS ?=	-r -j2

# dpkg-buildflags is what Debian's build used; fall back to its values
CFLAGS_DEB :=	$(shell dpkg-buildflags --get CFLAGS 2>/dev/null \
		  || echo -g -O2 -fstack-protector-strong -Wformat \
		  -Werror=format-security) \
		$(shell dpkg-buildflags --get CPPFLAGS 2>/dev/null)
LDFLAGS_DEB :=	$(shell dpkg-buildflags --get LDFLAGS 2>/dev/null)

ASAN_DIR :=	$(B)/asan
ASAN_NGINX :=	$(ASAN_DIR)/nginx/objs/nginx
ASAN_MODULE :=	$(ASAN_DIR)/nginx/objs/ngx_http_agent_module.so
# UBSan checks stay recoverable so that t/ubsan.supp can name the nginx
# core idioms it reports (memcpy of zero bytes from NULL); the tests run
# with halt_on_error, so any other report stops nginx and fails the test.
ASAN_CFLAGS :=	-g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined
ASAN_LDFLAGS :=	-fsanitize=address,undefined

.PHONY: all test asan asan-build demo clean FORCE

all: $(MODULE)

# the compiler flags, rewritten only when they change, so that a change
# reconfigures the build that uses them

$(B)/flags: FORCE
	@mkdir -p $(B)
	@echo '$(CFLAGS_DEB) | $(LDFLAGS_DEB)' | cmp -s - $@ \
	    || echo '$(CFLAGS_DEB) | $(LDFLAGS_DEB)' > $@

$(B)/asan-flags: FORCE
	@mkdir -p $(B)
	@echo '$(ASAN_CFLAGS) | $(ASAN_LDFLAGS)' | cmp -s - $@ \
	    || echo '$(ASAN_CFLAGS) | $(ASAN_LDFLAGS)' > $@

$(B)/nginx/objs/Makefile: config $(B)/flags $(NGINX_SRC)/conf_flags
	rm -rf $(B)/nginx
	mkdir -p $(B)
	cp -a $(NGINX_SRC) $(B)/nginx
	cd $(B)/nginx && bash -c '. ./conf_flags && ./configure \
	    --with-cc-opt="$(CFLAGS_DEB) -fPIC" \
	    --with-ld-opt="$(LDFLAGS_DEB) -fPIC" \
	    "$${NGX_CONF_FLAGS[@]}" \
	    --add-dynamic-module=$(CURDIR)' > $(B)/configure.log \
	    || { cat $(B)/configure.log; exit 1; }

$(MODULE): $(B)/nginx/objs/Makefile $(SOURCES)
	$(MAKE) -j$(JOBS) -C $(B)/nginx -f objs/Makefile modules

test: $(MODULE)
	TEST_NGINX_BINARY=$(NGINX_BIN) TEST_NGINX_MODULE=$(MODULE) \
	    $(PROVE) $(PROVE_FLAGS) t/

$(ASAN_DIR)/nginx/objs/Makefile: config $(B)/asan-flags
	rm -rf $(ASAN_DIR)
	mkdir -p $(ASAN_DIR)/src
	cd $(ASAN_DIR)/src && apt-get source --download-only nginx \
	    > $(ASAN_DIR)/source.log 2>&1 \
	    || { cat $(ASAN_DIR)/source.log; \
	         echo "make asan needs a deb-src entry: see README.md"; \
	         exit 1; }
	cd $(ASAN_DIR)/src && dpkg-source --no-check -x nginx_1.22.1-*.dsc \
	    $(ASAN_DIR)/nginx >> $(ASAN_DIR)/source.log 2>&1
	cd $(ASAN_DIR)/nginx && ./configure \
	    --with-cc-opt="$(ASAN_CFLAGS)" --with-ld-opt="$(ASAN_LDFLAGS)" \
	    --prefix=$(ASAN_DIR)/prefix \
	    --with-compat --with-debug --with-threads \
	    --with-http_ssl_module --with-http_auth_request_module \
	    --add-dynamic-module=$(CURDIR) > $(ASAN_DIR)/configure.log \
	    || { cat $(ASAN_DIR)/configure.log; exit 1; }

$(ASAN_NGINX): $(ASAN_DIR)/nginx/objs/Makefile $(SOURCES)
	$(MAKE) -j$(JOBS) -C $(ASAN_DIR)/nginx -f objs/Makefile binary modules

asan-build: $(ASAN_NGINX)

asan: $(ASAN_NGINX)
	TEST_NGINX_BINARY=$(ASAN_NGINX) TEST_NGINX_MODULE=$(ASAN_MODULE) \
	TEST_NGINX_SANITIZED=1 $(PROVE) $(PROVE_FLAGS) t/

demo: $(MODULE)
	bin/demo

clean:
	rm -rf $(B) demo
