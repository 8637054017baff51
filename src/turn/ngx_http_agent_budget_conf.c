
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_conf.h"
#include "ngx_http_agent_budget.h"


/* the budget directives and the zone's creation */


static ngx_int_t ngx_http_agent_budget_limit(ngx_conf_t *cf,
    ngx_str_t *value, size_t skip, ngx_http_agent_budget_limit_t *limit);
static ngx_int_t ngx_http_agent_budget_init_zone(ngx_shm_zone_t *shm_zone,
    void *data);


/*
 * agent_budget_zone key=$remote_user zone=name:1m tokens=100000/d
 *                   requests=60/m;
 */

char *
ngx_http_agent_budget_zone_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_agent_main_conf_t *amcf = conf;

    u_char                            *p;
    ssize_t                            size;
    ngx_str_t                         *value, name, s;
    ngx_uint_t                         i, which, limits;
    ngx_shm_zone_t                    *shm_zone;
    ngx_http_agent_budget_zone_t      *bz, **bzp;
    ngx_http_compile_complex_value_t   ccv;

    value = cf->args->elts;

    bz = ngx_pcalloc(cf->pool, sizeof(ngx_http_agent_budget_zone_t));
    if (bz == NULL) {
        return NGX_CONF_ERROR;
    }

    size = 0;
    name.len = 0;
    limits = 0;

    for (i = 1; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "key=", 4) == 0) {

            s.data = value[i].data + 4;
            s.len = value[i].len - 4;

            if (s.len == 0 || bz->key.value.data) {
                goto invalid;
            }

            ngx_memzero(&ccv, sizeof(ngx_http_compile_complex_value_t));

            ccv.cf = cf;
            ccv.value = &s;
            ccv.complex_value = &bz->key;

            if (ngx_http_compile_complex_value(&ccv) != NGX_OK) {
                return NGX_CONF_ERROR;
            }

            continue;
        }

        if (ngx_strncmp(value[i].data, "zone=", 5) == 0) {

            name.data = value[i].data + 5;

            p = (u_char *) ngx_strchr(name.data, ':');

            if (p == NULL) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid zone size \"%V\"", &value[i]);
                return NGX_CONF_ERROR;
            }

            name.len = p - name.data;

            s.data = p + 1;
            s.len = value[i].data + value[i].len - s.data;

            size = ngx_parse_size(&s);

            if (size == NGX_ERROR) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid zone size \"%V\"", &value[i]);
                return NGX_CONF_ERROR;
            }

            if (size < (ssize_t) (8 * ngx_pagesize)) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "zone \"%V\" is too small", &value[i]);
                return NGX_CONF_ERROR;
            }

            continue;
        }

        if (ngx_strncmp(value[i].data, "tokens=", 7) == 0) {
            which = NGX_HTTP_AGENT_BUDGET_TOKENS;

        } else if (ngx_strncmp(value[i].data, "requests=", 9) == 0) {
            which = NGX_HTTP_AGENT_BUDGET_REQUESTS;

        } else {
            goto invalid;
        }

        if (bz->limits[which].limit) {
            goto invalid;
        }

        if (ngx_http_agent_budget_limit(cf, &value[i],
                                        ngx_strlen(ngx_http_agent_budget_names
                                                   [which]) + 1,
                                        &bz->limits[which])
            != NGX_OK)
        {
            return NGX_CONF_ERROR;
        }

        limits++;
    }

    if (name.len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" must have \"zone=\" parameter",
                           &cmd->name);
        return NGX_CONF_ERROR;
    }

    if (bz->key.value.data == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" must have \"key=\" parameter",
                           &cmd->name);
        return NGX_CONF_ERROR;
    }

    if (limits == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" must have \"tokens=\" or \"requests=\"",
                           &cmd->name);
        return NGX_CONF_ERROR;
    }

    if (amcf->budgets == NULL) {
        amcf->budgets = ngx_array_create(cf->pool, 2,
                                        sizeof(ngx_http_agent_budget_zone_t *));
        if (amcf->budgets == NULL) {
            return NGX_CONF_ERROR;
        }
    }

    /* the same name again finds the zone already declared */

    shm_zone = ngx_shared_memory_add(cf, &name, size, &ngx_http_agent_module);

    if (shm_zone == NULL || shm_zone->data != NULL) {
        if (shm_zone) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "duplicate budget zone \"%V\"", &name);
        }

        return NGX_CONF_ERROR;
    }

    bz->name = name;
    bz->shm_zone = shm_zone;

    shm_zone->init = ngx_http_agent_budget_init_zone;
    shm_zone->data = bz;

    bzp = ngx_array_push(amcf->budgets);
    if (bzp == NULL) {
        return NGX_CONF_ERROR;
    }

    *bzp = bz;

    return NGX_CONF_OK;

invalid:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid parameter \"%V\"", &value[i]);
    return NGX_CONF_ERROR;
}


/* N/PERIOD: PERIOD is a time ("1d", "12h") or a unit alone ("m") */

static ngx_int_t
ngx_http_agent_budget_limit(ngx_conf_t *cf, ngx_str_t *value, size_t skip,
    ngx_http_agent_budget_limit_t *limit)
{
    u_char     *slash, unit[2];
    off_t       n;
    time_t      period;
    ngx_str_t   s;

    s.data = value->data + skip;
    slash = ngx_strlchr(s.data, value->data + value->len, '/');

    if (slash == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid limit \"%V\", it must be N/period, "
                           "e.g. 100000/d", value);
        return NGX_ERROR;
    }

    n = ngx_atoof(s.data, slash - s.data);

    if (n <= 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid limit \"%V\", it must be a positive "
                           "number per period", value);
        return NGX_ERROR;
    }

    s.data = slash + 1;
    s.len = value->data + value->len - s.data;

    if (s.len == 1) {
        unit[0] = '1';
        unit[1] = s.data[0];
        s.data = unit;
        s.len = 2;
    }

    period = ngx_parse_time(&s, 1);

    if (period == (time_t) NGX_ERROR || period <= 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid period in \"%V\", it must be a time "
                           "such as s, m, h, d or 12h", value);
        return NGX_ERROR;
    }

    limit->limit = n;
    limit->period = period;

    return NGX_OK;
}


/* agent_budget zone=name; more than one may apply */

char *
ngx_http_agent_budget_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    char  *p = conf;

    ngx_str_t                     *value;
    ngx_array_t                  **a;
    ngx_http_agent_budget_ref_t   *ref;

    a = (ngx_array_t **) (p + cmd->offset);
    value = cf->args->elts;

    if (ngx_strncmp(value[1].data, "zone=", 5) != 0 || value[1].len == 5) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\", it must be "
                           "zone=name", &value[1]);
        return NGX_CONF_ERROR;
    }

    if (*a == NULL) {
        *a = ngx_array_create(cf->pool, 1,
                              sizeof(ngx_http_agent_budget_ref_t));
        if (*a == NULL) {
            return NGX_CONF_ERROR;
        }
    }

    ref = ngx_array_push(*a);
    if (ref == NULL) {
        return NGX_CONF_ERROR;
    }

    ref->name.data = value[1].data + 5;
    ref->name.len = value[1].len - 5;
    ref->zone = NULL;
    ref->file = cf->conf_file->file.name.data;
    ref->line = cf->conf_file->line;

    return NGX_CONF_OK;
}


/* the http block is parsed: every agent_budget_zone is known */

char *
ngx_http_agent_budget_merge(ngx_conf_t *cf, ngx_array_t **prev,
    ngx_array_t **conf)
{
    ngx_uint_t                     i, j;
    ngx_http_agent_budget_ref_t   *ref;
    ngx_http_agent_budget_zone_t **bzp;
    ngx_http_agent_main_conf_t    *amcf;

    if (*conf == NULL) {
        *conf = *prev;
    }

    if (*conf == NULL) {
        return NGX_CONF_OK;
    }

    amcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_agent_module);

    ref = (*conf)->elts;

    for (i = 0; i < (*conf)->nelts; i++) {

        if (ref[i].zone) {
            continue;
        }

        bzp = amcf->budgets ? amcf->budgets->elts : NULL;

        for (j = 0; bzp && j < amcf->budgets->nelts; j++) {
            if (bzp[j]->name.len == ref[i].name.len
                && ngx_strncmp(bzp[j]->name.data, ref[i].name.data,
                               ref[i].name.len)
                   == 0)
            {
                ref[i].zone = bzp[j];
                break;
            }
        }

        if (ref[i].zone == NULL) {
            ngx_http_agent_conf_error(cf, ref[i].file, ref[i].line,
                                      "unknown budget zone \"%V\" (no "
                                      "\"agent_budget_zone\" declares it)",
                                      &ref[i].name);
            return NGX_CONF_ERROR;
        }
    }

    return NGX_CONF_OK;
}


/*
 * On reload the zone keeps its counters: the same memory, whose first
 * allocation is the tree (nginx reuses a zone of the same name and size)
 */

static ngx_int_t
ngx_http_agent_budget_init_zone(ngx_shm_zone_t *shm_zone, void *data)
{
    ngx_http_agent_budget_zone_t  *bz;

    bz = shm_zone->data;
    bz->shpool = (ngx_slab_pool_t *) shm_zone->shm.addr;

    if (data != NULL || shm_zone->shm.exists) {
        bz->sh = bz->shpool->data;
        return NGX_OK;
    }

    bz->sh = ngx_slab_alloc(bz->shpool, sizeof(ngx_http_agent_budget_sh_t));
    if (bz->sh == NULL) {
        return NGX_ERROR;
    }

    bz->shpool->data = bz->sh;

    ngx_rbtree_init(&bz->sh->keys, &bz->sh->keys_sentinel,
                    ngx_str_rbtree_insert_value);
    ngx_rbtree_init(&bz->sh->convs, &bz->sh->convs_sentinel,
                    ngx_str_rbtree_insert_value);
    ngx_queue_init(&bz->sh->lru);

    /* a full zone gives up its least recently used entries, quietly */
    bz->shpool->log_nomem = 0;

    return NGX_OK;
}
