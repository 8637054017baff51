# Build and test ngx_http_agent_module.
#
#   make          the dynamic module, against Debian's nginx-dev, with the
#                 flags Debian's own nginx binary was configured with
#   make test     the layer check and the test suite against the stock
#                 /usr/sbin/nginx
#   make layers   fails if a layer of src/ calls one above it
#   make asan     a full nginx 1.22.1 from Debian's source package with
#                 AddressSanitizer and UBSan, and the test suite against it
#   make upstream nginx 1.22.1 as nginx.org releases it (the orig tarball of
#                 Debian's source package, none of Debian's patches), the
#                 module as a --with-compat dynamic module of it, and a
#                 smoke test of the two (UPSTREAM_TESTS)
#   make demo     nginx in the foreground with nginx.conf.example, on
#                 AGENT_DEMO_PORT (8080), its provider on
#                 AGENT_DEMO_PROVIDER_PORT (8081); Ctrl-C stops it
#   make cluster  the demo on three nginx nodes sharing one PostgreSQL,
#                 behind a front nginx on AGENT_DEMO_PORT (bin/cluster);
#                 Ctrl-C stops it
#   make fuzz     the libFuzzer targets of fuzz/, see the end of this file

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

.PHONY: all test layers asan asan-build upstream upstream-build demo \
	demo-build cluster clean \
	FORCE fuzz fuzz-build

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

# no layer of src/ calls one above it (see config, bin/layers)
layers: $(MODULE)
	bin/layers $(B)/nginx/objs/addon

test: $(MODULE) layers
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

# The module against nginx's own source, unpatched: it uses nginx's public
# module interface only.  NGINX_TARBALL may name a release from nginx.org
# (nginx-1.x.y.tar.gz) to build against instead of Debian's orig tarball,
# which is fetched with the source package, or taken from make asan's.

UPSTREAM_DIR :=	$(B)/upstream
UPSTREAM_NGINX := $(UPSTREAM_DIR)/nginx/objs/nginx
UPSTREAM_MODULE := $(UPSTREAM_DIR)/nginx/objs/ngx_http_agent_module.so
UPSTREAM_TESTS ?= t/module.t t/turn.t t/store.t
NGINX_TARBALL ?=
# nginx.org's nginx-1.22.1.tar.gz, which Debian's orig tarball is
NGINX_ORIG_SHA256 := \
	9ebb333a9e82b952acd3e2b4aeb1d4ff6406f72491bab6cd9fe69f0dea737f31

$(B)/upstream-tarball: FORCE
	@mkdir -p $(B)
	@echo '$(NGINX_TARBALL)' | cmp -s - $@ \
	    || echo '$(NGINX_TARBALL)' > $@

$(UPSTREAM_DIR)/nginx/objs/Makefile: config $(B)/upstream-tarball
	rm -rf $(UPSTREAM_DIR)/nginx
	mkdir -p $(UPSTREAM_DIR)/src
	tarball='$(NGINX_TARBALL)'; \
	if [ -z "$$tarball" ]; then \
	    tarball=$$(ls $(ASAN_DIR)/src/nginx_1.22.1.orig.tar.* \
	                  $(UPSTREAM_DIR)/src/nginx_1.22.1.orig.tar.* \
	               2>/dev/null | head -1); \
	fi; \
	if [ -z "$$tarball" ]; then \
	    cd $(UPSTREAM_DIR)/src && apt-get source --download-only nginx \
	        > $(UPSTREAM_DIR)/source.log 2>&1 \
	    || { cat $(UPSTREAM_DIR)/source.log; \
	         echo "make upstream needs a deb-src entry: see README.md"; \
	         exit 1; }; \
	    tarball=$$(ls $(UPSTREAM_DIR)/src/nginx_1.22.1.orig.tar.*); \
	fi; \
	if [ -z '$(NGINX_TARBALL)' ]; then \
	    echo "$(NGINX_ORIG_SHA256)  $$tarball" | sha256sum -c --quiet \
	    || { echo "$$tarball is not nginx.org's nginx-1.22.1.tar.gz"; \
	         exit 1; }; \
	fi; \
	echo "make upstream: nginx from $$tarball"; \
	mkdir -p $(UPSTREAM_DIR)/nginx \
	&& tar -xf "$$tarball" -C $(UPSTREAM_DIR)/nginx --strip-components=1
	cd $(UPSTREAM_DIR)/nginx && ./configure \
	    --prefix=$(UPSTREAM_DIR)/prefix \
	    --with-compat --with-threads \
	    --add-dynamic-module=$(CURDIR) > $(UPSTREAM_DIR)/configure.log \
	    || { cat $(UPSTREAM_DIR)/configure.log; exit 1; }

$(UPSTREAM_NGINX): $(UPSTREAM_DIR)/nginx/objs/Makefile $(SOURCES)
	$(MAKE) -j$(JOBS) -C $(UPSTREAM_DIR)/nginx -f objs/Makefile \
	    binary modules

upstream-build: $(UPSTREAM_NGINX)

upstream: $(UPSTREAM_NGINX)
	$(UPSTREAM_NGINX) -V
	TEST_NGINX_BINARY=$(UPSTREAM_NGINX) \
	TEST_NGINX_MODULE=$(UPSTREAM_MODULE) \
	    $(PROVE) $(PROVE_FLAGS) $(UPSTREAM_TESTS)

# the compiler's lines go to demo/build.log, their tail shown on failure
demo: demo-build
	@bin/demo

cluster: demo-build
	@bin/cluster

demo-build:
	@mkdir -p demo
	@echo 'building the module (first time: 1-3 minutes)...'
	@$(MAKE) --no-print-directory all > demo/build.log 2>&1 \
	    || { tail -n 30 demo/build.log; \
	         echo 'the build failed: the whole log is in demo/build.log'; \
	         exit 1; }

clean:
	rm -rf $(B) demo


# ---------------------------------------------------------------------
# Fuzzing
#
#   make fuzz         builds the targets, runs each one's regression
#                     inputs (fuzz/regress/<target>/), then fuzzes each
#                     for FUZZ_TIME seconds from its seeds
#                     (fuzz/corpus/<target>/); a crash fails it and
#                     leaves its input in build/fuzz/artifacts/<target>/
#   make fuzz-build   the targets only, in build/fuzz/bin/
#
#   make fuzz FUZZ_TARGETS="sse json" FUZZ_TIME=600
#
# libFuzzer with ASan and UBSan, against nginx 1.22.1 from Debian's
# source package and the module, both compiled by clang for it; needs
# clang and libclang-rt-14-dev (.ci/deps --fuzz).  The targets and what
# each covers: docs/operations.md, "Fuzzing".

FUZZ_DIR :=	$(B)/fuzz
FUZZ_NGINX :=	$(FUZZ_DIR)/nginx
FUZZ_LIB :=	$(FUZZ_DIR)/libngx_fuzz.a
FUZZ_CC ?=	clang
FUZZ_TIME ?=	60
FUZZ_MAX_LEN ?=	65536
FUZZ_TARGETS ?=	sse openai_chat anthropic openai_responses json message \
		resolve tools request
# NGX_DEBUG_PALLOC: every pool allocation is a malloc() of its own, which
# ASan guards; nginx makes clang's warnings errors, and clang warns where
# gcc, which the module is built with, does not
FUZZ_CFLAGS :=	-g -O1 -fno-omit-frame-pointer -DNGX_DEBUG_PALLOC=1 \
		-fsanitize=fuzzer-no-link,address,undefined -Wno-error
FUZZ_LIBS :=	-lyajl -lsqlite3 -lpq -lpthread
FUZZ_INCS :=	$(addprefix -I $(FUZZ_NGINX)/, src/core src/event \
		  src/event/modules src/os/unix src/http src/http/modules \
		  objs) \
		$(addprefix -I src/, core provider conf fsm store turn api) -I fuzz \
		-I /usr/include/postgresql
FUZZ_COMMON :=	fuzz/ngx_http_agent_fuzz.h fuzz/ngx_http_agent_fuzz.c \
		fuzz/ngx_http_agent_fuzz_provider.c

# the tool target checks what would go into the log in place of it
FUZZ_LDFLAGS_tools := -Wl,--wrap=ngx_http_agent_emit

$(B)/fuzz-flags: FORCE
	@mkdir -p $(B)
	@echo '$(FUZZ_CC) $(FUZZ_CFLAGS)' | cmp -s - $@ \
	    || echo '$(FUZZ_CC) $(FUZZ_CFLAGS)' > $@

# the source package make asan fetched, or fetched anew
$(FUZZ_NGINX)/objs/Makefile: config $(B)/fuzz-flags
	rm -rf $(FUZZ_NGINX) $(FUZZ_DIR)/src $(FUZZ_LIB)
	mkdir -p $(FUZZ_DIR)/src
	if ls $(ASAN_DIR)/src/nginx_1.22.1-*.dsc > /dev/null 2>&1; then \
	    cp $(ASAN_DIR)/src/nginx_1.22.1* $(FUZZ_DIR)/src/; \
	else \
	    cd $(FUZZ_DIR)/src && apt-get source --download-only nginx \
	        > $(FUZZ_DIR)/source.log 2>&1 \
	    || { cat $(FUZZ_DIR)/source.log; \
	         echo "make fuzz needs a deb-src entry: see README.md"; \
	         exit 1; }; \
	fi
	cd $(FUZZ_DIR)/src && dpkg-source --no-check -x nginx_1.22.1-*.dsc \
	    $(FUZZ_NGINX) >> $(FUZZ_DIR)/source.log 2>&1
	cd $(FUZZ_NGINX) && CC=$(FUZZ_CC) ./configure \
	    --with-cc-opt="$(FUZZ_CFLAGS)" \
	    --with-ld-opt="-fsanitize=address,undefined" \
	    --with-compat --with-debug --with-threads \
	    --without-http_rewrite_module --without-http_gzip_module \
	    --add-dynamic-module=$(CURDIR) > $(FUZZ_DIR)/configure.log \
	    || { cat $(FUZZ_DIR)/configure.log; exit 1; }

# nginx's objects and the module's in one archive, nginx's main() renamed
# (libFuzzer has its own); a target that compiles a file of the module
# into itself takes the rest from here, and that file's object is not
# linked
$(FUZZ_LIB): $(FUZZ_NGINX)/objs/Makefile $(SOURCES)
	$(MAKE) -j$(JOBS) -C $(FUZZ_NGINX) -f objs/Makefile binary modules
	cd $(FUZZ_NGINX) \
	    && objcopy --redefine-sym main=ngx_http_agent_fuzz_nginx_main \
	           objs/src/core/nginx.o objs/nginx_fuzz.o \
	    && rm -f $@ \
	    && ar rcs $@ objs/nginx_fuzz.o objs/ngx_modules.o \
	           $$(find objs/src objs/addon -name '*.o' ! -name nginx.o)

$(FUZZ_DIR)/bin/%: fuzz/ngx_http_agent_fuzz_%.c $(FUZZ_COMMON) $(FUZZ_LIB)
	@mkdir -p $(FUZZ_DIR)/bin
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -Wall -Wextra \
	    -Wno-unused-parameter $(FUZZ_INCS) -o $@ $< \
	    fuzz/ngx_http_agent_fuzz.c fuzz/ngx_http_agent_fuzz_provider.c \
	    $(FUZZ_LIB) $(FUZZ_LIBS) $(FUZZ_LDFLAGS_$*)

fuzz-build: $(addprefix $(FUZZ_DIR)/bin/, $(FUZZ_TARGETS))

fuzz: fuzz-build
	FUZZ_TIME=$(FUZZ_TIME) FUZZ_MAX_LEN=$(FUZZ_MAX_LEN) \
	    fuzz/run $(FUZZ_DIR) $(FUZZ_TARGETS)
